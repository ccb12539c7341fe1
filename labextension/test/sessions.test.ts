import { describe, expect, it } from 'vitest';

import {
  apiPath,
  changeSince,
  deleteBlocked,
  entryState,
  filterRows,
  followRenames,
  groupRows,
  imageLabel,
  isNamed,
  ISessionRow,
  refusalText,
  rowActions,
  SavedSessionsModel,
  sessionRows
} from '../src/sessions';
import { IImage } from '../src/types';

const ROOT = '/home/me/notebooks';

function image(
  id: string,
  created: string,
  extra: Partial<IImage> = {}
): IImage {
  return { id, state: 'saved', name: `img-${id}`, created, ...extra };
}

describe('apiPath', () => {
  it('makes kernel paths relative to the server root', () => {
    expect(apiPath('/home/me/notebooks/a/train.ipynb', ROOT)).toBe(
      'a/train.ipynb'
    );
    expect(apiPath('/home/me/notebooks/a/train.ipynb', ROOT + '/')).toBe(
      'a/train.ipynb'
    );
    expect(apiPath('a/train.ipynb', ROOT)).toBe('a/train.ipynb');
  });
  it('refuses paths outside the root, including look-alike prefixes', () => {
    expect(apiPath('/tmp/x.ipynb', ROOT)).toBeNull();
    expect(apiPath('/home/me/notebooks2/x.ipynb', ROOT)).toBeNull();
  });
});

describe('rowActions', () => {
  it('offers nothing for an image that fails verification', () => {
    const foreign = image('f1', '2026-01-01T00:00:00Z', {
      state: 'invalid',
      error: 'image f1: signed with a different secret (key 1, ours is 2)'
    });
    expect(rowActions(foreign)).toEqual([]);
  });
  it('offers resume, details and delete for verified images', () => {
    const saved = image('s1', '2026-01-01T00:00:00Z');
    const pinned = image('p1', '2026-01-01T00:00:00Z', { state: 'suspended' });
    expect(rowActions(saved)).toEqual(['resume', 'details', 'delete']);
    expect(rowActions(pinned)).toEqual(['resume', 'details', 'delete']);
  });
});

describe('sessionRows', () => {
  it('sorts newest first and names rows after their notebook', () => {
    const rows = sessionRows(
      [
        image('old', '2026-11-28T10:00:00Z', {
          notebook_path: `${ROOT}/old.ipynb`
        }),
        image('new', '2026-11-29T10:00:00Z'),
        { id: 'broken', state: 'invalid', error: 'bad signature' }
      ],
      { kernelPaths: new Map() },
      ROOT
    );
    expect(rows.map(r => r.image.id)).toEqual(['new', 'old', 'broken']);
    expect(rows.map(r => r.title)).toEqual(['img-new', 'old.ipynb', 'broken']);
    expect(rows[1].notebook).toBe('old.ipynb');
    expect(rows.every(r => r.suspendedKernel === null)).toBe(true);
  });

  it("follows a suspended kernel's live session path", () => {
    const [row] = sessionRows(
      [
        image('s', '2026-11-29T10:00:00Z', {
          state: 'suspended',
          kernel_id: 'k1',
          notebook_path: `${ROOT}/before-rename.ipynb`
        })
      ],
      { kernelPaths: new Map([['k1', 'sub/renamed.ipynb']]) },
      ROOT
    );
    expect(row.suspendedKernel).toBe('k1');
    expect(row.notebook).toBe('sub/renamed.ipynb');
    expect(row.title).toBe('renamed.ipynb');
  });
});

describe('filterRows', () => {
  const rows = sessionRows(
    [
      image('a', '2026-11-29T10:00:00Z', {
        notebook_path: `${ROOT}/Train.ipynb`
      }),
      image('b', '2026-11-29T11:00:00Z', {
        notebook_path: `${ROOT}/eval.ipynb`
      })
    ],
    { kernelPaths: new Map() },
    ROOT
  );
  it('matches notebook names ignoring case', () => {
    expect(filterRows(rows, ' train ').map(r => r.image.id)).toEqual(['a']);
    expect(filterRows(rows, '').length).toBe(2);
    expect(filterRows(rows, 'nothing')).toEqual([]);
  });
});

describe('SavedSessionsModel', () => {
  it('goes from loading to ready and filters its rows', async () => {
    const model = new SavedSessionsModel(
      { listImages: async () => [image('a', '2026-11-29T10:00:00Z')] },
      () => ({ kernelPaths: new Map() }),
      ROOT
    );
    let changes = 0;
    model.changed.connect(() => changes++);
    expect(model.state).toBe('loading');
    const done = model.refresh();
    expect(model.busy).toBe(true);
    await done;
    expect(model.busy).toBe(false);
    expect(model.state).toBe('ready');
    expect(model.rows).toHaveLength(1);
    model.query = 'zzz';
    expect(model.rows).toHaveLength(0);
    expect(model.allRows).toHaveLength(1);
    expect(changes).toBe(3); // refresh started, refresh done, query set
  });

  it('runs one request at a time; those asked meanwhile share the next', async () => {
    let calls = 0;
    const model = new SavedSessionsModel(
      { listImages: async () => (calls++, []) },
      () => ({ kernelPaths: new Map() }),
      ROOT
    );
    // the first may have been answered before what prompted the others
    await Promise.all([model.refresh(), model.refresh(), model.refresh()]);
    expect(calls).toBe(2);
    await model.refresh();
    expect(calls).toBe(3);
  });

  it('keeps the rows it had and says why a refresh failed', async () => {
    let fail = false;
    const model = new SavedSessionsModel(
      {
        listImages: async () => {
          if (fail) {
            throw new Error('server said 500');
          }
          return [image('a', '2026-11-29T10:00:00Z')];
        }
      },
      () => ({ kernelPaths: new Map() }),
      ROOT
    );
    await model.refresh();
    fail = true;
    await model.refresh();
    expect(model.state).toBe('error');
    expect(model.error).toBe('server said 500');
    expect(model.allRows).toHaveLength(1);
  });

  it('keeps row notes, such as why a delete was refused', () => {
    const model = new SavedSessionsModel(
      { listImages: async () => [] },
      () => ({ kernelPaths: new Map() }),
      ROOT
    );
    let changes = 0;
    model.changed.connect(() => changes++);
    model.note('a', 'Not deleted: needed by suspended kernel k1');
    expect(model.noteFor('a')).toBe(
      'Not deleted: needed by suspended kernel k1'
    );
    expect(model.noteFor('b')).toBeUndefined();
    expect(changes).toBe(1);
    model.clearNote('a'); // the next action on the row
    expect(model.noteFor('a')).toBeUndefined();
    expect(changes).toBe(2);
  });

  it('drops a note once its cause no longer applies, not before', async () => {
    let images: IImage[] = [
      image('a', '2026-11-29T10:00:00Z', {
        state: 'suspended',
        kernel_id: 'k1'
      }),
      image('b', '2026-11-29T09:00:00Z')
    ];
    const model = new SavedSessionsModel(
      { listImages: async () => images },
      () => ({ kernelPaths: new Map() }),
      ROOT
    );
    await model.refresh();
    model.note('a', 'Not deleted: needed by the suspended kernel');
    model.note('b', 'Not deleted: the store is read-only');
    await model.refresh(); // nothing changed: both still apply
    expect(model.noteFor('a')).toBeDefined();
    expect(model.noteFor('b')).toBeDefined();
    // the suspended kernel was shut down: its image is only saved now
    images = [{ ...images[0], state: 'saved', kernel_id: 'k1' }, images[1]];
    await model.refresh();
    expect(model.noteFor('a')).toBeUndefined();
    expect(model.noteFor('b')).toBeDefined();
    images = [images[0]]; // and an image that is gone takes its note with it
    await model.refresh();
    expect(model.noteFor('b')).toBeUndefined();
  });
});

describe('groupRows', () => {
  it('makes one entry per notebook, its suspended kernel first, older images folded', () => {
    const rows = sessionRows(
      [
        image('named', '2026-11-28T12:00:00Z', {
          notebook_path: `${ROOT}/a.ipynb`
        }),
        image('pinned', '2026-11-28T11:00:00Z', {
          notebook_path: `${ROOT}/a.ipynb`,
          state: 'suspended',
          kernel_id: 'k1'
        }),
        image('other', '2026-11-28T10:30:00Z', {
          notebook_path: `${ROOT}/b.ipynb`
        }),
        image('first', '2026-11-28T10:00:00Z', {
          notebook_path: `${ROOT}/a.ipynb`
        }),
        image('console', '2026-11-28T09:00:00Z', { kernel_id: 'k2' }),
        image('console-old', '2026-11-28T08:00:00Z', { kernel_id: 'k2' })
      ],
      { kernelPaths: new Map() },
      ROOT
    );
    const entries = groupRows(rows).map(e => [
      e.latest.image.id,
      e.older.map(r => r.image.id)
    ]);
    expect(entries).toEqual([
      ['pinned', ['named', 'first']],
      ['other', []],
      ['console', ['console-old']]
    ]);
  });
  it('groups by the notebook file id, titled by the file path now', () => {
    const rows = sessionRows(
      [
        // saved after a rename by the kernel started under the old name
        image('after', '2026-11-28T12:00:00Z', {
          notebook_path: `${ROOT}/Untitled.ipynb`,
          notebook_id: 'f1',
          notebook_current_path: 'A.ipynb'
        }),
        // a new notebook of the old name: another file
        image('new', '2026-11-28T11:30:00Z', {
          notebook_path: `${ROOT}/Untitled.ipynb`,
          notebook_id: 'f2',
          notebook_current_path: 'Untitled.ipynb'
        }),
        image('before', '2026-11-28T11:00:00Z', {
          notebook_path: `${ROOT}/Untitled.ipynb`,
          notebook_id: 'f1',
          notebook_current_path: 'A.ipynb'
        })
      ],
      { kernelPaths: new Map([['k9', 'Untitled.ipynb']]) },
      ROOT
    );
    const entries = groupRows(rows);
    expect(
      entries.map(e => [e.latest.title, e.older.map(r => r.image.id)])
    ).toEqual([
      ['A.ipynb', ['before']],
      ['Untitled.ipynb', []]
    ]);
  });
  it('shows a deleted notebook where it was, never running', () => {
    const [row] = sessionRows(
      [
        image('gone', '2026-11-28T12:00:00Z', {
          notebook_path: `${ROOT}/Untitled.ipynb`,
          notebook_id: 'f1',
          notebook_current_path: null
        })
      ],
      { kernelPaths: new Map() },
      ROOT
    );
    expect([row.notebook, row.notebookGone]).toEqual(['Untitled.ipynb', true]);
    // a new Untitled.ipynb runs a kernel: not this entry's
    const live = new Map([['k9', 'Untitled.ipynb']]);
    expect(entryState(row, live, () => 'running').state).toBe('saved');
  });
  it('never folds images that fail verification', () => {
    const bad = { state: 'invalid' as const, kernel_id: 'k1' };
    const rows = sessionRows(
      [
        image('x1', '2026-11-28T12:00:00Z', bad),
        image('x2', '2026-11-28T11:00:00Z', bad)
      ],
      { kernelPaths: new Map() },
      ROOT
    );
    expect(groupRows(rows).map(e => e.older.length)).toEqual([0, 0]);
  });
});

describe('entryState', () => {
  const kernels = new Map([['k1', 'a.ipynb']]);
  const states: Record<string, string> = { k1: 'running', k2: 'running' };
  const state = (id: string) => states[id];
  it('says Suspended, Running or Saved for every entry', () => {
    const at = '2026-11-28T12:00:00Z';
    const suspended: ISessionRow = {
      image: image('s', at, { state: 'suspended', kernel_id: 'k0' }),
      notebook: 'a.ipynb',
      title: 'a.ipynb',
      suspendedKernel: 'k0',
      inUse: []
    };
    expect(entryState(suspended, kernels, state)).toEqual({
      state: 'suspended',
      kernel: 'k0'
    });
    const running = {
      ...suspended,
      image: image('r', at),
      suspendedKernel: null
    };
    expect(entryState(running, kernels, state)).toEqual({
      state: 'running',
      kernel: 'k1'
    });
    const closed = { ...running, notebook: 'b.ipynb', title: 'b.ipynb' };
    expect(entryState(closed, kernels, state).state).toBe('saved');
    // a console's entry: the kernel that wrote the image, while it is still there
    const console = {
      ...running,
      image: image('c', at, { kernel_id: 'k2' }),
      notebook: null
    };
    expect(entryState(console, kernels, state)).toEqual({
      state: 'running',
      kernel: 'k2'
    });
    const gone = { ...console, image: image('g', at, { kernel_id: 'k9' }) };
    expect(entryState(gone, kernels, state).state).toBe('saved');
  });
});

describe('deleteBlocked and imageLabel', () => {
  it('says why an image a kernel needs cannot be deleted', () => {
    const at = '2026-11-28T12:00:00Z';
    expect(deleteBlocked(image('s', at))).toBeNull();
    expect(deleteBlocked(image('p', at, { state: 'suspended' }))).toContain(
      'A suspended kernel needs this image'
    );
    expect(
      deleteBlocked(image('f', at, { state: 'restore-failed' }))
    ).toContain('restore of it failed');
    expect(deleteBlocked(image('r', at, { state: 'autosave' }))).toContain(
      "the running kernel's autosave"
    );
  });
  it('names an image by its name and short id, never by its notebook', () => {
    const id = '3f9a2c51e0b4d6e7f8a9b0c1d2e3f4a5';
    expect(imageLabel(image(id, '2026-11-28T12:00:00Z'))).toBe(
      `img-${id} (3f9a2c51)`
    );
    expect(imageLabel({ id, state: 'saved' })).toBe('3f9a2c51');
    // a console's kernel without a notebook: its default name is the kernel's id
    expect(imageLabel({ id, state: 'saved', name: 'kernel-1a2b3c4d' })).toBe(
      '3f9a2c51'
    );
  });
});

describe('what an entry says about its images', () => {
  const saved = (extra: Partial<IImage>): IImage => ({
    id: 'i',
    state: 'saved',
    ...extra
  });
  const row = (name: string, notebook: string | null): ISessionRow => ({
    image: saved({ name }),
    notebook,
    title: notebook ?? name,
    suspendedKernel: null,
    inUse: []
  });

  it('marks images saved under a name of their own', () => {
    expect(isNamed(row('before-training', 'work/My Model.ipynb'))).toBe(true);
    expect(isNamed(row('My-Model', 'work/My Model.ipynb'))).toBe(false);
    expect(isNamed(row('kernel-1a2b3c4d', null))).toBe(false);
    expect(isNamed(row('session', null))).toBe(false);
    // a console's default name: its session's, as its kernel recorded it
    const console = {
      ...row('Console-1', null),
      image: saved({ name: 'Console-1', notebook_path: '/home/me/Console 1' })
    };
    expect(isNamed(console)).toBe(false);
  });

  it('says what changed since the image before', () => {
    const older = saved({ size: { logical: 1_000_000 }, variables_count: 3 });
    expect(
      changeSince(
        saved({ size: { logical: 2_200_000 }, variables_count: 5 }),
        older
      )
    ).toBe('+1.2 MB, 2 variables more than the one before');
    expect(
      changeSince(
        saved({ size: { logical: 700_000 }, variables_count: 2 }),
        older
      )
    ).toBe('−300 KB, 1 variable fewer than the one before');
    expect(changeSince(older, older)).toBe(
      'same size and variables as the one before'
    );
  });

  it('names the variables added and removed when there are few', () => {
    const older = saved({
      size: { logical: 1_000_000 },
      variable_names: ['x', 'tmp']
    });
    expect(
      changeSince(
        saved({
          size: { logical: 2_200_000 },
          variable_names: ['x', 'df', 'model']
        }),
        older
      )
    ).toBe('+1.2 MB; new: df, model; gone: tmp');
    expect(
      changeSince(
        saved({ size: { logical: 1_500_000 }, variable_names: ['tmp', 'x'] }),
        older
      )
    ).toBe('+500 KB; same variables');
    expect(
      changeSince(
        saved({
          size: { logical: 1_000_000 },
          variable_names: ['x', 'tmp', 'a', 'b', 'c', 'd']
        }),
        older
      )
    ).toBe('4 new variables');
    expect(changeSince(older, older)).toBe(
      'same size and variables as the one before'
    );
  });
});

describe('renames made in this JupyterLab', () => {
  const T = Date.parse('2026-11-29T10:00:00Z');
  it('carry the images saved before them, and only those', () => {
    const renames = [{ from: 'Untitled.ipynb', to: 'A.ipynb', at: T }];
    expect(followRenames('Untitled.ipynb', T - 1000, renames)).toBe('A.ipynb');
    // a new Untitled.ipynb made after the rename is another notebook
    expect(followRenames('Untitled.ipynb', T + 1000, renames)).toBe(
      'Untitled.ipynb'
    );
  });
  it('follow a directory renamed, and renames in a row', () => {
    const renames = [
      { from: 'work', to: 'done', at: T },
      { from: 'done/a.ipynb', to: 'done/b.ipynb', at: T + 10 }
    ];
    expect(followRenames('work/a.ipynb', T - 1, renames)).toBe('done/b.ipynb');
    expect(followRenames('workshop/a.ipynb', T - 1, renames)).toBe(
      'workshop/a.ipynb'
    );
  });
  it('retitle the entry at once, without a reload', async () => {
    const model = new SavedSessionsModel(
      {
        listImages: async () => [
          image('u', '2026-11-29T09:00:00Z', {
            notebook_path: `${ROOT}/Untitled.ipynb`
          })
        ]
      },
      () => ({ kernelPaths: new Map() }),
      ROOT
    );
    await model.refresh();
    let changes = 0;
    model.changed.connect(() => changes++);
    model.noteRename('Untitled.ipynb', 'A.ipynb');
    expect(changes).toBe(1);
    expect(model.allRows[0].title).toBe('A.ipynb');
    expect(model.allRows[0].notebook).toBe('A.ipynb');
  });
});

describe('console images', () => {
  it('are titled after their console and the notebook they came from', () => {
    const rows = sessionRows(
      [
        image('nb', '2026-11-29T09:00:00Z', {
          kernel_id: 'k-nb',
          notebook_path: `${ROOT}/B.ipynb`
        }),
        image('c1', '2026-11-29T10:00:00Z', {
          kernel_id: 'c91d1d21-0000-4000-8000-000000000000',
          parent: 'nb'
        }),
        image('c2', '2026-11-29T11:00:00Z', {
          kernel_id: 'c91d1d21-0000-4000-8000-000000000000',
          parent: 'c1'
        }),
        image('lone', '2026-11-29T12:00:00Z', {
          kernel_id: 'dfd48e18-c88a-4000-8000-000000000000',
          notebook_path: `${ROOT}/Console 2`
        }),
        image('bare', '2026-11-29T13:00:00Z', {
          kernel_id: 'ab12cd34-0000-4000-8000-000000000000'
        })
      ],
      {
        kernelPaths: new Map(),
        consoles: new Map([
          ['c91d1d21-0000-4000-8000-000000000000', 'Console 3']
        ])
      },
      ROOT
    );
    const title = (id: string) => rows.find(r => r.image.id === id)!.title;
    expect(title('c2')).toBe('Console 3 (from B.ipynb)');
    expect(title('c1')).toBe('Console 3 (from B.ipynb)');
    expect(title('lone')).toBe('Console 2');
    expect(title('bare')).toBe('Console of kernel ab12cd34');
    // a console is no notebook: its images never merge into a notebook's entry
    expect(rows.find(r => r.image.id === 'lone')!.notebook).toBeNull();
  });
});

describe('actions on a row', () => {
  it('run one at a time: a second click while the first runs does nothing', async () => {
    const model = new SavedSessionsModel(
      { listImages: async () => [] },
      () => ({ kernelPaths: new Map() }),
      ROOT
    );
    let runs = 0;
    let finish: () => void = () => undefined;
    const action = () =>
      new Promise<void>(resolve => {
        runs++;
        finish = resolve;
      });
    const first = model.act('img', action);
    expect(model.isActing('img')).toBe(true);
    await model.act('img', action); // returns at once
    expect(runs).toBe(1);
    finish();
    await first;
    expect(model.isActing('img')).toBe(false);
    await Promise.all([model.act('img', async () => void runs++)]);
    expect(runs).toBe(2);
  });
  it('count entries, not images, when the filter hides them all', async () => {
    const model = new SavedSessionsModel(
      {
        listImages: async () => [
          image('a1', '2026-11-29T09:00:00Z', { notebook_path: 'a.ipynb' }),
          image('a2', '2026-11-29T10:00:00Z', { notebook_path: 'a.ipynb' }),
          image('b1', '2026-11-29T11:00:00Z', { notebook_path: 'b.ipynb' })
        ]
      },
      () => ({ kernelPaths: new Map() }),
      ROOT
    );
    await model.refresh();
    model.query = 'nothing';
    expect(model.entries).toHaveLength(0);
    expect(model.entryCount).toBe(2);
  });
});

describe('refusalText', () => {
  const image = '3f9a2c51e0b4d6e7f8a9b0c1d2e3f4a5';
  const kernel = 'dfd48e18-c88a-4617-8293-a4b5c6d7e8f9';
  it('says what holds the image, in words that fit the kernel', () => {
    const running = refusalText(
      `image ${image} is needed by running kernel ${kernel}; resume or shut down that kernel first`
    );
    expect(running).toBe(
      'running kernel dfd48e18 keeps it to recover from a crash. Its next autosave, or shutting that kernel down, releases it.'
    );
    expect(running).not.toContain('resume');
    expect(
      refusalText(`image ${image} is needed by suspended kernel ${kernel}; x`)
    ).toContain('suspended kernel dfd48e18 needs it to come back');
    expect(refusalText(`refusing to delete image ${image}: bad`)).toBe(
      'refusing to delete image 3f9a2c51: bad'
    );
  });
});
