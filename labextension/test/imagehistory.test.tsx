import { nullTranslator } from '@jupyterlab/translation';
import * as React from 'react';
import { renderToStaticMarkup } from 'react-dom/server';
import { describe, expect, it } from 'vitest';

import { InUseLine, TriggerFact, triggerText } from '../src/badges';
import { ImageChanges } from '../src/imagechanges';
import {
  inUseNames,
  previousInEntry,
  sessionRows,
  variableDiff
} from '../src/sessions';
import { IImage, IImageDetails, IVariable } from '../src/types';

const trans = nullTranslator.load('jupyter_ckpt');
const ROOT = '/home/me';

function image(id: string, created: string, extra: Partial<IImage> = {}) {
  return { id, state: 'saved', created, ...extra } as IImage;
}

const v = (name: string, extra: Partial<IVariable> = {}): IVariable => ({
  name,
  type: 'int',
  status: 'saved',
  bytes: 28,
  ...extra
});

describe('trigger labels', () => {
  it('names each trigger and says what wrote the image on hover', () => {
    for (const trigger of [
      'autosave',
      'idle',
      'manual',
      'shutdown',
      'replaced'
    ] as const) {
      expect(triggerText(trigger, trans)?.label).toBe(trigger);
    }
    const html = renderToStaticMarkup(
      <TriggerFact trigger="idle" trans={trans} />
    );
    expect(html).toContain('data-trigger="idle"');
    expect(html).toContain(
      'title="Written when the idle kernel was suspended"'
    );
  });
  it('shows nothing for an image an older server wrote', () => {
    expect(triggerText(null, trans)).toBeNull();
    expect(
      renderToStaticMarkup(<TriggerFact trigger={null} trans={trans} />)
    ).toBe('');
  });
});

describe('in use', () => {
  const used = image('a', '2026-12-01T10:00:00Z', {
    in_use_by: [
      {
        kernel_id: 'k-console',
        sessions: [{ name: 'Console 3', type: 'console' }]
      },
      {
        kernel_id: 'k-nb',
        sessions: [{ name: 'old.ipynb', path: 'old.ipynb', type: 'notebook' }]
      },
      { kernel_id: '0b1c2d3e-1111-2222-3333-444455556666', sessions: [] }
    ]
  });

  it('names the consoles and notebooks whose kernels run from an image', () => {
    const names = inUseNames(used, {
      kernelPaths: new Map([['k-nb', 'work/renamed.ipynb']]),
      consoles: new Map()
    });
    // the live notebook path wins over the server's; unknown sessions by kernel id
    expect(names).toEqual(['Console 3', 'renamed.ipynb', 'kernel 0b1c2d3e']);
    const [row] = sessionRows([used], { kernelPaths: new Map() }, ROOT);
    expect(row.inUse).toEqual(['Console 3', 'old.ipynb', 'kernel 0b1c2d3e']);
    expect(
      sessionRows(
        [image('b', '2026-12-01T10:00:00Z')],
        { kernelPaths: new Map() },
        ROOT
      )[0].inUse
    ).toEqual([]);
  });

  it('renders "in use by" only when some kernel runs from the image', () => {
    const html = renderToStaticMarkup(
      <InUseLine names={['Console 3']} trans={trans} />
    );
    expect(html).toContain('in use by Console 3');
    expect(renderToStaticMarkup(<InUseLine names={[]} trans={trans} />)).toBe(
      ''
    );
  });
});

describe('the diff to the previous image', () => {
  it('lists the variables added, removed and changed, by the manifests', () => {
    const diff = variableDiff(
      [v('x'), v('df', { type: 'DataFrame', bytes: 900 }), v('new'), v('w')],
      [v('x'), v('df', { type: 'DataFrame', bytes: 800 }), v('gone'), v('w')]
    );
    expect(diff).toEqual({
      added: ['new'],
      removed: ['gone'],
      changed: ['df']
    });
    // a variable that could not be saved then and can now has changed too
    expect(
      variableDiff([v('fh')], [v('fh', { status: 'lost', bytes: undefined })])
        .changed
    ).toEqual(['fh']);
  });

  it('finds the image saved before, in the same entry only', () => {
    const nb = `${ROOT}/a.ipynb`;
    const rows = sessionRows(
      [
        image('a1', '2026-12-01T10:00:00Z', { notebook_path: nb }),
        image('b1', '2026-12-01T10:30:00Z', {
          notebook_path: `${ROOT}/b.ipynb`
        }),
        image('a2', '2026-12-01T11:00:00Z', { notebook_path: nb }),
        image('a3', '2026-12-01T12:00:00Z', { notebook_path: nb })
      ],
      { kernelPaths: new Map() },
      ROOT
    );
    expect(previousInEntry(rows, 'a3')?.image.id).toBe('a2');
    expect(previousInEntry(rows, 'a2')?.image.id).toBe('a1');
    expect(previousInEntry(rows, 'a1')).toBeUndefined();
    expect(previousInEntry(rows, 'b1')).toBeUndefined();
  });

  it('renders the changes, or says that there were none', () => {
    const details = (id: string, variables: IVariable[]): IImageDetails => ({
      id: id.repeat(32),
      state: 'saved',
      name: 'work',
      variables
    });
    const html = renderToStaticMarkup(
      <ImageChanges
        image={details('b', [v('x', { bytes: 99 }), v('y')])}
        previous={details('a', [v('x'), v('z')])}
        trans={trans}
      />
    );
    expect(html).toContain('Since the image before it,');
    expect(html).toContain('work (aaaaaaaa)');
    expect(html).toContain(
      '<li data-change="added">Added: <code>y</code></li>'
    );
    expect(html).toContain(
      '<li data-change="removed">Removed: <code>z</code></li>'
    );
    expect(html).toContain(
      '<li data-change="changed">Changed: <code>x</code></li>'
    );
    const same = renderToStaticMarkup(
      <ImageChanges
        image={details('b', [v('x')])}
        previous={details('a', [v('x')])}
        trans={trans}
      />
    );
    expect(same).toContain('no variable added, removed or changed');
    const first = renderToStaticMarkup(
      <ImageChanges
        image={details('b', [v('x')])}
        previous={null}
        trans={trans}
      />
    );
    expect(first).toContain('nothing to compare with');
  });
});
