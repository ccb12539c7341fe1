import { Signal } from '@lumino/signaling';
import { describe, expect, it } from 'vitest';

import { describeKernel, KernelStatusModel } from '../src/kernelstatus';
import { followEvents } from '../src/liveevents';
import { Refresher } from '../src/refresher';
import { SavedSessionsModel } from '../src/sessions';
import { EVENT_SCHEMA, IStatusReply } from '../src/types';

/** A promise and the function that resolves it. */
function deferred<T>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>(r => (resolve = r));
  return { promise, resolve };
}

describe('Refresher', () => {
  it('gives a call made during a load the next load, shared', async () => {
    const loads: ReturnType<typeof deferred<void>>[] = [];
    const refresher = new Refresher(() => {
      const load = deferred<void>();
      loads.push(load);
      return load.promise;
    });
    const first = refresher.run();
    const second = refresher.run();
    const third = refresher.run();
    expect(loads).toHaveLength(1); // never two at once
    expect(second).toBe(third);
    loads[0].resolve();
    await first;
    await new Promise(r => setTimeout(r, 0));
    expect(loads).toHaveLength(2); // the change asked for after the first load started
    loads[1].resolve();
    await second;
    expect(refresher.busy).toBe(false);
  });
});

describe('describeKernel after a cell', () => {
  const busy = {
    kernel_id: 'k1',
    state: 'running' as const,
    blocked_by: ['the kernel is busy'],
    seconds_until_suspend: 600
  };
  it('leaves the server\'s "busy" out where this page sees the kernel itself', () => {
    expect(describeKernel(busy, 0, 0).text).toBe(
      'Not suspended: the kernel is busy'
    );
    expect(describeKernel(busy, 0, 0, undefined, undefined, true).text).toBe(
      'suspends in 10 min'
    );
  });
});

/** A status API whose replies the test hands out one by one. */
function statusApi() {
  const replies: ReturnType<typeof deferred<IStatusReply>>[] = [];
  return {
    replies,
    api: {
      status: () => {
        const reply = deferred<IStatusReply>();
        replies.push(reply);
        return reply.promise;
      }
    }
  };
}

function emission(data: Record<string, unknown>) {
  return { schema_id: EVENT_SCHEMA, ...data };
}

describe('followEvents', () => {
  function setUp() {
    const { api, replies } = statusApi();
    const kernels = new KernelStatusModel(api);
    const sessions = new SavedSessionsModel(
      { listImages: async () => [] },
      () => ({ kernelPaths: new Map(), consoles: new Map() }),
      '/'
    );
    const stream = new Signal<any, any>({});
    const refreshed: string[] = [];
    const notices: string[] = [];
    followEvents(stream, {
      kernels,
      sessions,
      knowsKernel: id => id === 'k1',
      refreshRunning: async () => {
        refreshed.push('running');
      },
      tell: event => {
        if (event.status === 'error') {
          notices.push('failed');
        }
      }
    });
    return { kernels, stream, replies, refreshed, notices };
  }

  it("shows a kernel's new state at once, and a stale reply does not undo it", async () => {
    const { kernels, stream, replies, refreshed } = setUp();
    const before = kernels.refresh(); // asked before the kernel was suspended
    stream.emit(
      emission({
        action: 'state',
        status: 'success',
        kernel_id: 'k1',
        state: 'suspended'
      })
    );
    expect(kernels.isSuspended('k1')).toBe(true);
    expect(refreshed).toEqual([]); // this page knows the kernel
    replies[0].resolve({ kernels: [{ kernel_id: 'k1', state: 'running' }] });
    await before;
    expect(kernels.isSuspended('k1')).toBe(true);
    // the event asked for a fresh status, loaded after the stale one
    await new Promise(r => setTimeout(r, 0));
    expect(replies).toHaveLength(2);
    replies[1].resolve({ kernels: [{ kernel_id: 'k1', state: 'suspended' }] });
  });

  it('forgets a kernel shut down elsewhere and reloads the running lists', () => {
    const { kernels, stream, refreshed } = setUp();
    kernels.noteState('k1', 'running', Date.now());
    stream.emit(
      emission({
        action: 'state',
        status: 'success',
        kernel_id: 'k1',
        state: 'gone'
      })
    );
    expect(kernels.kernel('k1')).toBeUndefined();
    expect(kernels.isGone('k1')).toBe(true);
    expect(refreshed).toEqual(['running']);
    stream.emit(
      emission({
        action: 'state',
        status: 'success',
        kernel_id: 'k2',
        state: 'running'
      })
    );
    expect(refreshed).toEqual(['running', 'running']); // a kernel new to this page
  });

  it("shows the store's health at once", () => {
    const { kernels, stream } = setUp();
    stream.emit(
      emission({
        action: 'store',
        status: 'error',
        msg: 'the store is read-only'
      })
    );
    expect(kernels.storeProblem).toBe(
      'Store unavailable: the store is read-only'
    );
    stream.emit(emission({ action: 'store', status: 'success' }));
    expect(kernels.storeProblem).toBeNull();
  });

  it('ignores other schemas and tells what the user must know', () => {
    const { kernels, stream, notices } = setUp();
    stream.emit({ schema_id: 'other', action: 'store', status: 'error' });
    expect(kernels.storeProblem).toBeNull();
    stream.emit(
      emission({ action: 'restore', status: 'error', kernel_id: 'k1' })
    );
    expect(notices).toEqual(['failed']);
  });
});
