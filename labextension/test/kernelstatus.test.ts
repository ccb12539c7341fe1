import { describe, expect, it } from 'vitest';

import {
  commandBlocked,
  confirmSuspend,
  describeKernel,
  endsWithoutMessage,
  eventNotice,
  KernelStatusModel,
  plainBlocker,
  progressText,
  recoveredTitle,
  storeProblem,
  suspendWarning,
  unsaveableText,
  nameList,
  excludeCode,
  wakesKernel
} from '../src/kernelstatus';
import { EVENT_SCHEMA, IKernelStatus } from '../src/types';

const T0 = Date.parse('2026-11-29T12:00:00Z');

function running(extra: Partial<IKernelStatus> = {}): IKernelStatus {
  return {
    kernel_id: 'k1',
    state: 'running',
    idle_timeout: 1800,
    seconds_until_suspend: 14 * 60,
    blocked_by: [],
    gpu: { bytes: 12_300_000_000, holds_gpu: true },
    ...extra
  };
}

describe('describeKernel', () => {
  it('shows GPU memory and a countdown that runs between fetches', () => {
    expect(describeKernel(running(), T0, T0).text).toBe(
      'GPU 12.3 GB · suspends in 14 min'
    );
    expect(describeKernel(running(), T0, T0 + 4 * 60_000).text).toBe(
      'GPU 12.3 GB · suspends in 10 min'
    );
    expect(describeKernel(running(), T0, T0 + 20 * 60_000).text).toBe(
      'GPU 12.3 GB · suspends soon'
    );
  });

  it('says a kernel waits for a GPU, and its place, before anything else', () => {
    const gpu_demand = {
      ahead: 2,
      bytes: 20_000_000_000,
      device: 0,
      source: 'restore' as const,
      waiting_seconds: 30,
      message: 'Waiting for a GPU: 2 ahead of you'
    };
    const suspended: IKernelStatus = {
      kernel_id: 'k1',
      state: 'suspended',
      gpu_demand
    };
    expect(describeKernel(suspended, T0, T0 + 30_000, T0)).toEqual({
      state: 'waiting',
      text: 'Waiting for a GPU: 2 ahead of you',
      title:
        'Its restore needs 20.0 GB of GPU memory on GPU 0; idle kernels are suspended to make room, and it goes on as soon as the memory is free (waiting for 1 min).'
    });
    const asked = running({
      gpu_demand: { ...gpu_demand, ahead: 0, source: 'kernel', device: null }
    });
    expect(describeKernel(asked, T0, T0).title).toMatch(
      /^It asked for 20.0 GB of GPU memory; idle kernels/
    );
  });

  it('leaves GPU out for a kernel that holds none', () => {
    const s = running({ gpu: { bytes: 0, holds_gpu: false } });
    expect(describeKernel(s, T0, T0).text).toBe('suspends in 14 min');
  });

  it('says what blocks suspension, a failed suspend first', () => {
    const blocked = running({
      blocked_by: ['the kernel is busy'],
      seconds_until_suspend: null
    });
    expect(describeKernel(blocked, T0, T0)).toMatchObject({
      state: 'blocked',
      text: 'GPU 12.3 GB · Not suspended: the kernel is busy'
    });
    const failed = running({
      last_failure: {
        action: 'suspend',
        reason: 'open file fh',
        at: '2026-11-29T11:00:00Z'
      }
    });
    expect(describeKernel(failed, T0, T0).text).toBe(
      'GPU 12.3 GB · Not suspended: open file fh'
    );
    const checkpointFailed = running({
      last_failure: {
        action: 'checkpoint',
        reason: 'disk full',
        at: '2026-11-29T11:00:00Z'
      }
    });
    expect(describeKernel(checkpointFailed, T0, T0).state).toBe('running');
  });

  it('says up front that unsaveable variables keep the kernel from suspending', () => {
    const wont = "Won't suspend: gen, lock, sock cannot be saved";
    const s = running({
      blocked_by: [wont, 'the kernel is busy'],
      seconds_until_suspend: null,
      last_failure: {
        action: 'suspend',
        reason: 'variables cannot be saved (on_unsaveable=keep): gen',
        at: '2026-11-29T11:00:00Z',
        lost: { gen: "TypeError: cannot pickle 'generator' object" }
      }
    });
    expect(describeKernel(s, T0, T0)).toMatchObject({
      state: 'blocked',
      text: `GPU 12.3 GB · ${wont}`
    });
    expect(describeKernel(s, T0, T0).title).toContain('%ckpt exclude');
  });

  it('names a variable that cannot be saved and what to do about it', () => {
    const failed = running({
      gpu: { holds_gpu: false },
      last_failure: {
        action: 'suspend',
        reason:
          "variables cannot be saved (on_unsaveable=keep): fh (TypeError: cannot save an open file ('scratch.txt'))",
        at: '2026-11-29T11:00:00Z',
        lost: {
          fh: "TypeError: cannot save an open file ('scratch.txt')",
          gen: "TypeError: cannot pickle 'generator' object"
        }
      }
    });
    expect(describeKernel(failed, T0, T0)).toMatchObject({
      state: 'blocked',
      text: 'Not suspended: fh is an open file and 1 more'
    });
    const { title } = describeKernel(failed, T0, T0);
    expect(title).toContain(
      'fh is an open file; gen is a generator, which cannot be saved.'
    );
    expect(title).toContain('exclude them from saved state');
    expect(title).not.toMatch(/on_unsaveable|`/);
    expect(
      unsaveableText('gen', "TypeError: cannot pickle 'generator' object")
    ).toBe('gen is a generator, which cannot be saved');
    expect(unsaveableText('x', 'RecursionError: too deep')).toBe(
      'x cannot be saved'
    );
  });

  it('lists names short enough for a notification', () => {
    expect(nameList(['gen'])).toBe('gen');
    expect(nameList(['gen', 'sock', 'lock'])).toBe('gen, sock and lock');
    expect(nameList(['a', 'b', 'c', 'd', 'e'])).toBe('a, b, c and 2 more');
    expect(excludeCode(['gen', 'sock'])).toBe(
      '%load_ext jupyter_ckpt\n%ckpt exclude gen sock'
    );
  });

  it('says why a kernel stays up in plain words, not setting names', () => {
    expect(plainBlocker('holds no GPU memory (gpu_only=True)')).toBe(
      'it uses no GPU'
    );
    expect(
      plainBlocker('1 client(s) connected (suspend_connected=False)')
    ).toBe('it is open in a browser tab');
    expect(plainBlocker("kernel name 'ir' is in exclude_kernel_names")).toBe(
      'kernels of this kind are never suspended'
    );
    expect(plainBlocker('idle suspension is off (idle_timeout=0)')).toBe(
      'idle suspension is off'
    );
    expect(plainBlocker('the kernel is busy')).toBe('the kernel is busy');
    const blocked = running({
      gpu: { holds_gpu: false },
      blocked_by: ['holds no GPU memory (gpu_only=True)'],
      seconds_until_suspend: null
    });
    expect(describeKernel(blocked, T0, T0)).toMatchObject({
      text: 'Not suspended: it uses no GPU',
      title: 'The kernel is not suspended when idle: it uses no GPU.'
    });
  });

  it('describes suspended, suspending and restoring kernels', () => {
    const suspended: IKernelStatus = {
      kernel_id: 'k1',
      state: 'suspended',
      image: 'abc',
      suspended_at: '2026-11-29T11:00:00Z',
      gpu_bytes: 2_000_000_000
    };
    const d = describeKernel(suspended, T0, T0);
    expect(d.text).toBe('Suspended · run a cell to resume');
    expect(d.title).toContain('2.0 GB');
    expect(d.title).toContain('1 h ago');
    expect(
      describeKernel({ ...suspended, state: 'suspending' }, T0, T0).text
    ).toBe('Suspending…');
    expect(describeKernel(suspended, T0, T0 + 5000, T0).text).toBe(
      'Restoring… 5 s'
    );
    expect(
      describeKernel({ ...suspended, state: 'restoring' }, T0, T0 + 2000).text
    ).toBe('Restoring… 2 s');
  });
});

describe('storeProblem', () => {
  const store = {
    url: 's3://bucket/ckpt',
    since: '2026-11-29T12:00:00Z'
  };

  it('says why the store cannot be reached, and nothing while it can', () => {
    const error =
      'cannot reach the store s3://bucket/ckpt (connection refused)';
    expect(
      storeProblem({ kernels: [], store: { ...store, ok: false, error } })
    ).toBe(`Store unavailable: ${error}`);
    expect(
      storeProblem({ kernels: [], store: { ...store, ok: true, error: null } })
    ).toBeNull();
    expect(storeProblem({ kernels: [] })).toBeNull();
  });

  it('is what the model reports after a refresh', async () => {
    const m = new KernelStatusModel({
      status: async () => ({
        kernels: [],
        store: { ...store, ok: false, error: 'connection refused' }
      })
    });
    await m.refresh();
    expect(m.storeProblem).toBe('Store unavailable: connection refused');
  });
});

describe('KernelStatusModel', () => {
  function model(states: IKernelStatus['state'][]) {
    let call = 0;
    return new KernelStatusModel({
      status: async () => ({
        kernels: [
          {
            kernel_id: 'k1',
            state: states[Math.min(call++, states.length - 1)]
          }
        ]
      })
    });
  }

  it('marks a suspended kernel restoring until the server sees it running', async () => {
    const m = model(['suspended', 'restoring', 'running']);
    await m.refresh();
    m.markRestoring('k1', Date.now() - 1000);
    expect(m.describe('k1', Date.now())?.state).toBe('restoring');
    await m.refresh(); // a status fetched while the restore runs
    expect(m.describe('k1', Date.now())?.state).toBe('restoring');
    await m.refresh();
    expect(m.describe('k1', Date.now())?.state).toBe('running');
  });

  it('follows the server when it still says suspended after the message', async () => {
    const m = model(['suspended']);
    await m.refresh();
    m.markRestoring('k1', Date.now() - 1000);
    expect(m.describe('k1', Date.now())?.state).toBe('restoring');
    await m.refresh(); // asked after the message: no restore is under way
    expect(m.describe('k1', Date.now())?.text).toBe(
      'Suspended · run a cell to resume'
    );
  });

  it('restores a suspended kernel only for messages that need it', () => {
    expect(wakesKernel('shell', 'execute_request')).toBe(true);
    expect(wakesKernel('shell', 'complete_request')).toBe(true);
    for (const probe of [
      'kernel_info_request',
      'comm_info_request',
      'history_request'
    ]) {
      expect(wakesKernel('shell', probe)).toBe(false);
    }
    expect(wakesKernel('control', 'debug_request')).toBe(false);
    // ipywidgets' control comm, opened on connect, is closed by the server
    const probes = new Set<string>();
    const control = { comm_id: 'c1', target_name: 'jupyter.widget.control' };
    expect(wakesKernel('shell', 'comm_open', control, probes)).toBe(false);
    expect(wakesKernel('shell', 'comm_msg', { comm_id: 'c1' }, probes)).toBe(
      false
    );
    const widget = { comm_id: 'w1', target_name: 'jupyter.widget' };
    expect(wakesKernel('shell', 'comm_open', widget, probes)).toBe(true);
    expect(wakesKernel('shell', 'comm_msg', { comm_id: 'w1' }, probes)).toBe(
      true
    );
  });

  it('does not mark running kernels restoring', async () => {
    const m = model(['running']);
    await m.refresh();
    m.markRestoring('k1', Date.now());
    expect(m.describe('k1', Date.now())?.state).toBe('running');
    expect(m.describe('unknown', Date.now())).toBeNull();
  });

  it('asks about one kernel and keeps what it knows of the others', async () => {
    const asked: (string | undefined)[] = [];
    const m = new KernelStatusModel({
      status: async (kernelId?: string) => {
        asked.push(kernelId);
        return kernelId
          ? {
              kernels: [
                { kernel_id: 'k1', state: 'running' as const, blocked_by: [] }
              ]
            }
          : {
              kernels: [
                {
                  kernel_id: 'k1',
                  state: 'running' as const,
                  blocked_by: ['the kernel is busy']
                },
                { kernel_id: 'k2', state: 'suspended' as const }
              ]
            };
      }
    });
    await m.refresh();
    expect(m.describe('k1', Date.now())?.state).toBe('blocked');
    await m.refresh('k1');
    expect(asked).toEqual([undefined, 'k1']);
    expect(m.describe('k1', Date.now())?.state).toBe('running');
    expect(m.isSuspended('k2')).toBe(true);
  });

  it('is unavailable, and forgets kernels, when the server does not answer', async () => {
    let fail = false;
    const m = new KernelStatusModel({
      status: async () => {
        if (fail) {
          throw new Error('404');
        }
        return { kernels: [{ kernel_id: 'k1', state: 'running' }] };
      }
    });
    await m.refresh();
    expect(m.available).toBe(true);
    fail = true;
    await expect(m.refresh()).rejects.toThrow('404');
    expect(m.available).toBe(false);
    expect(m.kernel('k1')).toBeUndefined();
  });
});

describe('eventNotice', () => {
  const event = { schema_id: EVENT_SCHEMA, kernel_id: 'k1' } as const;
  it('reports failed restores only', () => {
    const notice = eventNotice({
      ...event,
      action: 'restore',
      status: 'error',
      msg: 'no GPU'
    });
    expect(notice?.lead).toBe('Could not restore kernel k1');
    expect(notice?.why).toBe(
      'no GPU. The kernel runs without its saved variables; the image is kept.'
    );
    expect(
      eventNotice({ ...event, action: 'restore', status: 'success' })
    ).toBeNull();
    expect(
      eventNotice({ ...event, action: 'suspend', status: 'error' })
    ).toBeNull();
  });
});

describe('explicit suspend of a kernel working in the background', () => {
  const working = running({
    blocked_by: ['a thread started by `_train` is running'],
    background_work: ['a thread started by `_train` is running']
  });

  function api(kernels: IKernelStatus[], asked: string[]) {
    return {
      status: async (kernelId?: string) => {
        asked.push(kernelId ?? '(all)');
        return { kernels };
      }
    };
  }

  it('names the work it would stop, and shows it in the status bar', () => {
    expect(suspendWarning(working)).toBe(
      'The kernel is still working in the background: a thread started by `_train` is running. Suspending it now saves its variables but stops this work.'
    );
    expect(describeKernel(working, T0, T0).text).toBe(
      'GPU 12.3 GB · Not suspended: a thread started by _train is running'
    );
    expect(suspendWarning(running())).toBeNull();
    expect(suspendWarning(undefined)).toBeNull();
  });

  it('asks the server about this kernel, then the user, and obeys the answer', async () => {
    const asked: string[] = [];
    const warnings: string[] = [];
    const ask = (answer: boolean) => async (w: string) => {
      warnings.push(w);
      return answer;
    };
    expect(await confirmSuspend(api([working], asked), 'k1', ask(false))).toBe(
      false
    );
    expect(await confirmSuspend(api([working], asked), 'k1', ask(true))).toBe(
      true
    );
    expect(asked).toEqual(['k1', 'k1']);
    expect(warnings).toEqual([
      suspendWarning(working),
      suspendWarning(working)
    ]);
  });

  it('does not ask when there is no background work or no answer', async () => {
    const never = async () => {
      throw new Error('asked');
    };
    expect(await confirmSuspend(api([running()], []), 'k1', never)).toBe(true);
    const failing = {
      status: async () => {
        throw new Error('offline');
      }
    };
    expect(await confirmSuspend(failing, 'k1', never)).toBe(true);
  });

  it('keeps polling only while background work may end unannounced', () => {
    expect(endsWithoutMessage(working)).toBe(true);
    expect(endsWithoutMessage(running())).toBe(false);
  });
});

describe('recoveredTitle', () => {
  it('explains a kernel recovered after a crash, and only such a kernel', () => {
    const recovered = running({
      state: 'suspended',
      recovered: {
        autosave_at: '2026-11-29T11:00:00Z',
        crashed_after: '2026-11-29T11:05:00Z'
      }
    });
    const title = recoveredTitle(recovered)!;
    expect(title).toContain('Kernel state autosaved');
    expect(title).toContain('The server stopped after');
    expect(title).toContain('Changes made after the autosave are not in it.');
    expect(
      recoveredTitle(
        running({ recovered: { autosave_at: 'x', crashed_after: null } })
      )
    ).toContain('The server stopped without suspending it.');
    expect(recoveredTitle(running())).toBeNull();
    expect(recoveredTitle(undefined)).toBeNull();
  });
});

describe('commandBlocked', () => {
  it('says why the save and suspend commands cannot run, or nothing', () => {
    const suspended = (id: string) => id === 'k2';
    expect(commandBlocked(null, suspended, true)?.short).toBe(
      'no notebook kernel'
    );
    expect(commandBlocked('k2', suspended, true)).toEqual({
      short: 'kernel suspended',
      long: 'the kernel is suspended and its state saved; run a cell to resume it.'
    });
    expect(commandBlocked('k1', suspended, false)?.short).toBe(
      'server extension not answering'
    );
    expect(commandBlocked('k1', suspended, true)).toBeNull();
  });
});

describe('progress of an image being written or read', () => {
  const MB = 1_000_000;
  const GB = 1000 * MB;
  const event = (
    phase: 'checkpoint' | 'suspend' | 'restore',
    done: number,
    total: number
  ) => ({
    schema_id: EVENT_SCHEMA,
    action: 'progress' as const,
    status: 'running' as const,
    kernel_id: 'k1',
    phase,
    bytes_done: done,
    bytes_total: total
  });

  it('says bytes done of the total, as the panel formats sizes', () => {
    expect(
      progressText({ phase: 'checkpoint', done: 120 * MB, total: 512 * MB })
    ).toBe('Saving kernel state · 120 MB of 512 MB');
    expect(
      progressText({ phase: 'restore', done: 1.2 * GB, total: 4 * GB })
    ).toBe('Restoring · 1.2 GB of 4.0 GB');
  });

  it('shows the latest progress until the outcome, then falls back to the time', async () => {
    const m = new KernelStatusModel({
      status: async () => ({
        kernels: [{ kernel_id: 'k1', state: 'restoring' as const }]
      })
    });
    await m.refresh();
    expect(m.describe('k1', Date.now())?.text).toMatch(/^Restoring… \d+ s$/);
    m.noteEvent(event('restore', 0.5 * GB, 4 * GB));
    m.noteEvent(event('restore', 1.2 * GB, 4 * GB));
    expect(m.describe('k1', Date.now())?.text).toBe(
      'Restoring · 1.2 GB of 4.0 GB'
    );
    m.noteEvent({
      schema_id: EVENT_SCHEMA,
      action: 'restore',
      status: 'success',
      kernel_id: 'k1'
    });
    expect(m.progress('k1')).toBeUndefined();
    expect(m.describe('k1', Date.now())?.text).toMatch(/^Restoring… \d+ s$/);
  });

  it("drops a restore's progress once the server no longer reports it", async () => {
    const states: IKernelStatus['state'][] = [
      'restoring',
      'restoring',
      'running'
    ];
    let call = 0;
    const m = new KernelStatusModel({
      status: async () => ({
        kernels: [{ kernel_id: 'k1', state: states[call++] }]
      })
    });
    await m.refresh();
    m.noteEvent(event('restore', 1.2 * GB, 4 * GB));
    await m.refresh();
    expect(m.progress('k1')?.done).toBe(1.2 * GB);
    await m.refresh(); // its outcome's event was missed
    expect(m.progress('k1')).toBeUndefined();
  });

  it('says what is written while a suspend or a checkpoint runs', () => {
    const p = { done: 120 * MB, total: 512 * MB };
    expect(
      describeKernel(running({ state: 'suspending' }), T0, T0, undefined, {
        phase: 'suspend',
        ...p
      }).text
    ).toBe('Suspending · 120 MB of 512 MB');
    const saving = describeKernel(running(), T0, T0, undefined, {
      phase: 'checkpoint',
      ...p
    });
    expect([saving.state, saving.text]).toEqual([
      'running',
      'Saving kernel state · 120 MB of 512 MB'
    ]);
  });
});

describe('KernelStatusModel.retain', () => {
  it('forgets kernels shut down without asking the server', async () => {
    let asked = 0;
    const model = new KernelStatusModel({
      status: async () => {
        asked++;
        return {
          kernels: [
            { kernel_id: 'k1', state: 'suspended' },
            { kernel_id: 'k2', state: 'running' }
          ]
        };
      }
    });
    await model.refresh();
    let changes = 0;
    model.changed.connect(() => changes++);
    model.retain(new Set(['k2']));
    expect(model.isSuspended('k1')).toBe(false);
    expect(model.kernel('k2')?.state).toBe('running');
    expect(changes).toBe(1);
    model.retain(new Set(['k2']));
    expect(changes).toBe(1);
    expect(asked).toBe(1);
  });
});
