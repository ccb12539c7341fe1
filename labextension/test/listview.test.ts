import { describe, expect, it } from 'vitest';

import { matchesFilter, parseFilter } from '../src/listfilter';
import {
  deletable,
  savedBefore,
  Selection,
  sortEntries,
  isSortKey,
  whyNotDeletable
} from '../src/listview';
import { filterRows, groupRows, sessionRows } from '../src/sessions';
import { IImage } from '../src/types';

const ROOT = '/home/me';

function image(id: string, created: string, extra: Partial<IImage> = {}) {
  return { id, state: 'saved', created, ...extra } as IImage;
}

const rows = sessionRows(
  [
    image('a1', '2026-11-01T10:00:00Z', {
      notebook_path: `${ROOT}/train.ipynb`,
      name: 'baseline',
      trigger: 'manual',
      variable_names: ['model', 'df'],
      size: { logical: 5000 }
    }),
    image('a2', '2026-11-03T10:00:00Z', {
      notebook_path: `${ROOT}/train.ipynb`,
      name: 'train',
      trigger: 'idle',
      variable_names: ['model', 'df', 'history'],
      size: { logical: 7000 }
    }),
    image('b1', '2026-11-02T10:00:00Z', {
      notebook_path: `${ROOT}/Eval 10.ipynb`,
      name: 'Eval-10',
      trigger: 'autosave',
      variable_names: ['scores'],
      size: { logical: 100_000 }
    }),
    image('c1', '2026-11-04T10:00:00Z', {
      notebook_path: `${ROOT}/eval 9.ipynb`,
      name: 'eval-9',
      trigger: 'autosave',
      variable_names: [],
      size: { logical: 10 }
    })
  ],
  { kernelPaths: new Map() },
  ROOT
);
const ids = (list: { image: IImage }[]) => list.map(r => r.image.id);

describe('parseFilter', () => {
  it('reads plain words and field prefixes, ignoring case', () => {
    expect(parseFilter(' Var:DF  label:best trigger:idle nb:x train ')).toEqual(
      [
        { field: 'var', text: 'df' },
        { field: 'label', text: 'best' },
        { field: 'trigger', text: 'idle' },
        { field: 'notebook', text: 'x' },
        { field: null, text: 'train' }
      ]
    );
  });
  it('keeps an unknown prefix as plain text and drops a bare prefix', () => {
    expect(parseFilter('a:b var:')).toEqual([{ field: null, text: 'a:b' }]);
    expect(parseFilter('   ')).toEqual([]);
  });
});

describe('matchesFilter', () => {
  const fields = {
    notebook: ['train.ipynb'],
    label: ['baseline'],
    var: ['model'],
    trigger: ['manual']
  };
  it('needs every term; a prefix searches its field only', () => {
    expect(matchesFilter(fields, parseFilter('var:mod'))).toBe(true);
    expect(matchesFilter(fields, parseFilter('var:train'))).toBe(false);
    expect(matchesFilter(fields, parseFilter('train manual'))).toBe(true);
    expect(matchesFilter(fields, parseFilter('train idle'))).toBe(false);
    expect(matchesFilter(fields, [])).toBe(true);
  });
});

describe('filterRows', () => {
  it('finds images by variable, label, trigger or any of them', () => {
    expect(ids(filterRows(rows, 'var:history'))).toEqual(['a2']);
    expect(ids(filterRows(rows, 'var:model'))).toEqual(['a2', 'a1']);
    expect(ids(filterRows(rows, 'label:baseline'))).toEqual(['a1']);
    expect(ids(filterRows(rows, 'trigger:autosave'))).toEqual(['c1', 'b1']);
    expect(ids(filterRows(rows, 'scores'))).toEqual(['b1']);
    expect(ids(filterRows(rows, 'notebook:eval trigger:auto'))).toEqual([
      'c1',
      'b1'
    ]);
  });
});

describe('sortEntries', () => {
  const entries = groupRows(rows);
  const heads = (key: 'date' | 'name' | 'size') =>
    sortEntries(entries, key).map(e => e.latest.title);
  it('keeps newest first by date', () => {
    expect(heads('date')).toEqual([
      'eval 9.ipynb',
      'train.ipynb',
      'Eval 10.ipynb'
    ]);
  });
  it('sorts names without case, numbers as numbers', () => {
    expect(heads('name')).toEqual([
      'eval 9.ipynb',
      'Eval 10.ipynb',
      'train.ipynb'
    ]);
  });
  it('sorts by the size of all of an entry’s images, largest first', () => {
    expect(heads('size')).toEqual([
      'Eval 10.ipynb',
      'train.ipynb',
      'eval 9.ipynb'
    ]);
  });
  it('knows its keys', () => {
    expect(isSortKey('size')).toBe(true);
    expect(isSortKey('bogus')).toBe(false);
  });
});

describe('Selection', () => {
  const order = ['a', 'b', 'c', 'd', 'e'];
  const selected = (s: Selection) => [...s.ids].sort();
  it('selects one row on a click, toggles on Ctrl, spans on Shift', () => {
    const s = new Selection();
    s.click('b', {}, order);
    expect(selected(s)).toEqual(['b']);
    s.click('d', { extend: true }, order);
    expect(selected(s)).toEqual(['b', 'c', 'd']);
    // the anchor stays: a second Shift+click spans from it again
    s.click('a', { extend: true }, order);
    expect(selected(s)).toEqual(['a', 'b']);
    s.click('e', { toggle: true }, order);
    expect(selected(s)).toEqual(['a', 'b', 'e']);
    s.click('e', { toggle: true }, order);
    expect(selected(s)).toEqual(['a', 'b']);
    // Ctrl+Shift adds the span from the anchor (e, the last Ctrl+click)
    s.click('d', { toggle: true, extend: true }, order);
    expect(selected(s)).toEqual(['a', 'b', 'd', 'e']);
  });
  it('selects alone on Shift without an anchor in view', () => {
    const s = new Selection();
    s.click('c', { extend: true }, order);
    expect(selected(s)).toEqual(['c']);
    s.click('d', { extend: true }, ['d', 'e']); // c is folded away now
    expect(selected(s)).toEqual(['d']);
  });
  it('selects all, clears, and forgets images gone; signals only changes', () => {
    const s = new Selection();
    let changes = 0;
    s.changed.connect(() => changes++);
    s.selectAll(order);
    s.selectAll(order);
    expect(s.size).toBe(5);
    expect(changes).toBe(1);
    s.retain(new Set(['a', 'e', 'x']));
    expect(selected(s)).toEqual(['a', 'e']);
    s.clear();
    expect(s.size).toBe(0);
    expect(changes).toBe(3);
  });
});

describe('bulk delete', () => {
  it('keeps images a kernel needs or that fail verification', () => {
    const some = sessionRows(
      [
        image('s', '2026-11-01T00:00:00Z', { state: 'suspended' }),
        image('v', '2026-11-01T00:00:00Z', { state: 'invalid' }),
        image('k', '2026-11-01T00:00:00Z', { state: 'autosave' }),
        image('ok', '2026-11-01T00:00:00Z')
      ],
      { kernelPaths: new Map() },
      ROOT
    );
    const { remove, keep } = deletable(some, whyNotDeletable);
    expect(ids(remove)).toEqual(['ok']);
    expect(ids(keep).sort()).toEqual(['k', 's', 'v']);
  });
  it('takes the images saved before local midnight of a date', () => {
    const day = (d: Date) =>
      `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, '0')}-${String(
        d.getDate()
      ).padStart(2, '0')}`;
    // local midnight of 3 Nov, whatever the zone the test runs in
    const limit = day(new Date(2026, 10, 3));
    const before = savedBefore(rows, limit)!;
    const cut = new Date(2026, 10, 3).getTime();
    expect(ids(before).sort()).toEqual(
      rows
        .filter(r => Date.parse(r.image.created!) < cut)
        .map(r => r.image.id)
        .sort()
    );
    expect(savedBefore(rows, '2000-01-01')).toEqual([]);
    expect(savedBefore(rows, '')).toBeNull();
    expect(savedBefore(rows, 'yesterday')).toBeNull();
  });
});
