import { describe, expect, it } from 'vitest';

import {
  IResumeHost,
  ITargetChoice,
  newNotebookDir,
  resumeChoices,
  resumeInto
} from '../src/resume';
import { ISessionRow } from '../src/sessions';
import { IResumeReply } from '../src/types';

function row(extra: Partial<ISessionRow> = {}): ISessionRow {
  return {
    image: { id: 'img1', state: 'saved' },
    notebook: 'work/train.ipynb',
    title: 'train.ipynb',
    suspendedKernel: null,
    inUse: [],
    ...extra
  };
}

/** A host that records what was asked of it; `files` exist, the user answers `agree`
 * to replacing a kernel and `choice` when asked where to resume; `suspended` kernels
 * are still suspended, and those of `consoles` have a console to reopen. */
function host(
  files: string[] = ['work/train.ipynb'],
  agree = true,
  {
    suspended = ['k0'],
    consoles = [] as string[],
    choice = null as ITargetChoice | null
  } = {}
) {
  const calls: string[] = [];
  let kernels = 0;
  const fake: IResumeHost = {
    exists: async path => files.includes(path),
    isSuspended: async id => suspended.includes(id),
    confirmReplace: async path => {
      calls.push(`confirm ${path}`);
      return agree;
    },
    askTarget: async (_, why) => {
      calls.push(`ask ${why}`);
      return choice;
    },
    openConsole: async id => {
      calls.push(`reopen ${id}`);
      return consoles.includes(id);
    },
    newNotebook: async dir => {
      const path = `${dir ? dir + '/' : ''}Untitled.ipynb`;
      calls.push(`create ${path}`);
      return path;
    },
    deleteFile: async path => {
      calls.push(`delete ${path}`);
    },
    resume: async (id, path): Promise<IResumeReply> => {
      calls.push(`resume ${id} ${path ?? '-'}`);
      return {
        kernel: { id: `k${++kernels}`, name: 'python3' },
        session: path ? { id: 's', path } : null,
        restore: {}
      };
    },
    open: async (path, kernelId) => {
      calls.push(`open ${path ?? 'console'} ${kernelId}`);
    }
  };
  return { fake, calls };
}

describe('resumeChoices', () => {
  it('offers its notebook, a new notebook and a console, in Title Case', () => {
    expect(resumeChoices(row()).map(c => [c.label, c.enabled])).toEqual([
      ['Resume in Its Notebook', true],
      ['Resume in New Notebook', true],
      ['Resume in Console', true]
    ]);
  });
  it('disables its notebook when the image names none', () => {
    const own = resumeChoices(row({ notebook: null }))[0];
    expect(own.enabled).toBe(false);
    expect(own.caption).toContain('new notebook or a console');
  });
  it('opens a suspended kernel as it is rather than resuming it again', () => {
    expect(resumeChoices(row({ suspendedKernel: 'k0' }))[0].label).toBe(
      'Open Its Notebook'
    );
  });
});

describe('newNotebookDir', () => {
  it("is the original notebook's directory, else the root", () => {
    expect(newNotebookDir(row())).toBe('work');
    expect(newNotebookDir(row({ notebook: 'a.ipynb' }))).toBe('');
    expect(newNotebookDir(row({ notebook: null }))).toBe('');
  });
});

describe('resumeInto', () => {
  it('binds the restored kernel to its notebook after asking', async () => {
    const { fake, calls } = host();
    const done = await resumeInto(row(), 'notebook', fake);
    expect(done?.path).toBe('work/train.ipynb');
    expect(calls).toEqual([
      'confirm work/train.ipynb',
      'resume img1 work/train.ipynb',
      'open work/train.ipynb k1'
    ]);
  });
  it('starts nothing when the user keeps the running kernel', async () => {
    const { fake, calls } = host(['work/train.ipynb'], false);
    expect(await resumeInto(row(), 'notebook', fake)).toBeNull();
    expect(calls).toEqual(['confirm work/train.ipynb']);
  });
  it('asks where to resume when its notebook is gone, never guessing', async () => {
    const cancelled = host([]);
    expect(await resumeInto(row(), 'notebook', cancelled.fake)).toBeNull();
    expect(cancelled.calls).toEqual(['ask notebook-gone']);

    const picked = host(['work/other.ipynb'], true, {
      choice: { target: 'notebook', path: 'work/other.ipynb' }
    });
    const done = await resumeInto(row(), 'notebook', picked.fake);
    expect(done?.path).toBe('work/other.ipynb');
    expect(picked.calls).toEqual([
      'ask notebook-gone',
      'confirm work/other.ipynb',
      'resume img1 work/other.ipynb',
      'open work/other.ipynb k1'
    ]);

    const console = host([], true, { choice: { target: 'console' } });
    await resumeInto(row(), 'notebook', console.fake);
    expect(console.calls).toEqual([
      'ask notebook-gone',
      'resume img1 -',
      'open console k1'
    ]);
  });
  it('asks too for a suspended kernel whose notebook file is gone', async () => {
    const { fake, calls } = host([], true, { choice: { target: 'console' } });
    await resumeInto(row({ suspendedKernel: 'k0' }), 'notebook', fake);
    expect(calls).toEqual([
      'ask notebook-gone',
      'resume img1 -',
      'open console k1'
    ]);
  });
  it('resumes the image of a suspended kernel shut down since the list loaded', async () => {
    const { fake, calls } = host(['work/train.ipynb'], true, { suspended: [] });
    const done = await resumeInto(
      row({ suspendedKernel: 'k0' }),
      'notebook',
      fake
    );
    expect(done?.path).toBe('work/train.ipynb');
    expect(calls).toEqual([
      'confirm work/train.ipynb',
      'resume img1 work/train.ipynb',
      'open work/train.ipynb k1'
    ]);
  });
  it("reopens a suspended console's session, or asks when it is closed", async () => {
    const console = row({ notebook: null, suspendedKernel: 'k0' });
    const open = host([], true, { consoles: ['k0'] });
    expect(await resumeInto(console, 'notebook', open.fake)).toBeNull();
    expect(open.calls).toEqual(['reopen k0']);

    const closed = host([], true, { choice: { target: 'new-notebook' } });
    const done = await resumeInto(console, 'notebook', closed.fake);
    expect(done?.path).toBe('Untitled.ipynb');
    expect(closed.calls).toEqual([
      'reopen k0',
      'ask console-closed',
      'create Untitled.ipynb',
      'resume img1 Untitled.ipynb',
      'open Untitled.ipynb k1'
    ]);
  });
  it('opens a suspended kernel without starting another', async () => {
    const { fake, calls } = host();
    const done = await resumeInto(
      row({ suspendedKernel: 'k0' }),
      'notebook',
      fake
    );
    expect(done).toBeNull();
    expect(calls).toEqual(['open work/train.ipynb k0']);
  });
  it('creates a new notebook next to the original, leaving the original alone', async () => {
    const { fake, calls } = host();
    const done = await resumeInto(row(), 'new-notebook', fake);
    expect(done?.path).toBe('work/Untitled.ipynb');
    expect(calls).toEqual([
      'create work/Untitled.ipynb',
      'resume img1 work/Untitled.ipynb',
      'open work/Untitled.ipynb k1'
    ]);
  });
  it('removes the new notebook again when the resume fails', async () => {
    const { fake, calls } = host();
    fake.resume = async () => {
      throw new Error('incompatible');
    };
    await expect(resumeInto(row(), 'new-notebook', fake)).rejects.toThrow(
      'incompatible'
    );
    expect(calls).toEqual([
      'create work/Untitled.ipynb',
      'delete work/Untitled.ipynb'
    ]);
  });
  it('resumes into a console bound to no notebook, even for a suspended kernel', async () => {
    const { fake, calls } = host();
    const done = await resumeInto(
      row({ suspendedKernel: 'k0' }),
      'console',
      fake
    );
    expect(done?.path).toBeNull();
    expect(calls).toEqual(['resume img1 -', 'open console k1']);
  });
});
