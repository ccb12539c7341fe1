/** What the status bar says about a notebook's kernel, from `GET /api/ckpt/status`. */

import { ISignal, Signal } from '@lumino/signaling';

import { formatBytes, formatDuration, relativeTime } from './format';
import { ICkptApi, ICkptEvent, IKernelStatus } from './types';

export interface IStatusText {
  state: 'running' | 'blocked' | 'suspending' | 'suspended' | 'restoring';
  /** Short text for the status bar. */
  text: string;
  /** Longer explanation for hover and screen readers. */
  title: string;
}

/**
 * Describe one kernel. `fetchedAt` is when `status` was fetched and `now` the current
 * time (ms), so the countdown runs between fetches; `restoringSince` is when a message
 * that restores the kernel was sent, if one was.
 */
export function describeKernel(
  status: IKernelStatus,
  fetchedAt: number,
  now: number,
  restoringSince?: number
): IStatusText {
  if (status.state === 'restoring' || restoringSince !== undefined) {
    const elapsed = formatDuration(
      (now - (restoringSince ?? fetchedAt)) / 1000
    );
    const image = status.image ? ` from image ${status.image}` : '';
    return {
      state: 'restoring',
      text: `Restoring… ${elapsed}`,
      title: `Restoring the kernel's variables${image}; running for ${elapsed}. The cell runs when they are back.`
    };
  }
  if (status.state === 'suspended') {
    const freed = status.gpu_bytes
      ? `, freeing ${formatBytes(status.gpu_bytes)} of GPU memory`
      : '';
    const when = status.suspended_at
      ? ` ${relativeTime(status.suspended_at, now)}`
      : '';
    return {
      state: 'suspended',
      text: 'Suspended · run a cell to resume',
      title: `The kernel was saved to image ${status.image ?? ''} and shut down${when}${freed}. Running a cell restores it with its variables.`
    };
  }
  if (status.state === 'suspending') {
    return {
      state: 'suspending',
      text: 'Suspending…',
      title:
        'Writing the kernel to an image; it shuts down when the image is saved.'
    };
  }
  const gpuBytes = status.gpu?.bytes ?? 0;
  const gpu = status.gpu?.holds_gpu
    ? gpuBytes
      ? `GPU ${formatBytes(gpuBytes)}`
      : 'GPU'
    : null;
  const failure =
    status.last_failure?.action === 'suspend'
      ? status.last_failure.reason
      : null;
  const blockers = failure ? [failure] : (status.blocked_by ?? []);
  if (blockers.length > 0) {
    return {
      state: 'blocked',
      text: [gpu, `not suspended: ${blockers[0]}`].filter(Boolean).join(' · '),
      title: `The kernel is not suspended when idle: ${blockers.join('; ')}.`
    };
  }
  const left = (status.seconds_until_suspend ?? 0) - (now - fetchedAt) / 1000;
  const when =
    left > 0 ? `suspends in ${formatDuration(left)}` : 'suspends soon';
  return {
    state: 'running',
    text: [gpu, when].filter(Boolean).join(' · '),
    title: `Idle kernels are saved to an image and shut down after ${formatDuration(status.idle_timeout ?? 0)}; running a cell resets the clock.`
  };
}

/**
 * The messages that restore a suspended kernel (the server's `WAKING` list): running
 * code, completion or inspection while typing, a widget talking to the kernel. What a
 * frontend sends on connect (kernel info, comm info, history) is answered without it.
 */
const WAKING = new Set([
  'execute_request',
  'is_complete_request',
  'complete_request',
  'inspect_request',
  'comm_open',
  'comm_msg'
]);

/** Whether sending this message to a suspended kernel restores it. */
export function wakesKernel(channel: string, msgType: string): boolean {
  return channel === 'shell' && WAKING.has(msgType);
}

/** The server's view of every kernel, refreshed on demand (events, kernel activity). */
export class KernelStatusModel {
  constructor(private readonly _api: Pick<ICkptApi, 'status'>) {}

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Whether the server answered the last request (false: no jupyter_ckpt_server). */
  get available(): boolean {
    return this._available;
  }

  kernel(kernelId: string): IKernelStatus | undefined {
    return this._kernels.get(kernelId);
  }

  isSuspended(kernelId: string): boolean {
    return this._kernels.get(kernelId)?.state === 'suspended';
  }

  /** A message that needs the kernel was sent to it while it was suspended: it reads as
   * restoring until the server, asked after that, says whether it is. */
  markRestoring(kernelId: string, now: number): void {
    if (this.isSuspended(kernelId) && !this._restoring.has(kernelId)) {
      this._restoring.set(kernelId, now);
      this._changed.emit();
    }
  }

  describe(kernelId: string, now: number): IStatusText | null {
    const status = this._kernels.get(kernelId);
    return status
      ? describeKernel(
          status,
          this._fetchedAt,
          now,
          this._restoring.get(kernelId)
        )
      : null;
  }

  /** Fetch the status; concurrent calls share one request. Rejects when it fails. */
  refresh(): Promise<void> {
    if (!this._pending) {
      this._pending = this._load().finally(() => (this._pending = null));
    }
    return this._pending;
  }

  private async _load(): Promise<void> {
    const asked = Date.now();
    try {
      const reply = await this._api.status();
      this._fetchedAt = Date.now();
      this._kernels = new Map(reply.kernels.map(k => [k.kernel_id, k]));
      // The server's state wins: a restore is over once it sees the kernel running, and
      // none is under way if it still says suspended when asked after the message.
      for (const [id, since] of [...this._restoring]) {
        const state = this._kernels.get(id)?.state;
        if (
          state === undefined ||
          state === 'running' ||
          (state === 'suspended' && since < asked)
        ) {
          this._restoring.delete(id);
        }
      }
      this._available = true;
    } catch (reason) {
      this._available = false;
      this._kernels.clear();
      throw reason;
    } finally {
      this._changed.emit();
    }
  }

  private _changed = new Signal<this, void>(this);
  private _kernels = new Map<string, IKernelStatus>();
  private _restoring = new Map<string, number>();
  private _fetchedAt = 0;
  private _available = false;
  private _pending: Promise<void> | null = null;
}

/**
 * What to tell the user about a server event, if anything: a restore that failed (the
 * kernel runs without its variables). Failed idle suspensions show in the status bar
 * instead, and failed commands report themselves.
 */
export function eventNotice(event: ICkptEvent): string | null {
  if (event.action === 'restore' && event.status === 'error') {
    return `Could not restore kernel ${event.kernel_id ?? ''}: ${event.msg ?? 'unknown error'}. It runs without its saved variables; the image is kept.`;
  }
  return null;
}

/**
 * What suspending the kernel now would stop, or null when it has no background work (a
 * kernel the server does not list has none the user could lose).
 */
export function suspendWarning(
  status: IKernelStatus | undefined
): string | null {
  const work = status?.background_work ?? [];
  if (work.length === 0) {
    return null;
  }
  return `The kernel is still working in the background: ${work.join('; ')}. Suspending it now saves its variables but stops this work.`;
}

/**
 * Whether an explicit suspend may go ahead: the server checks the kernel's background
 * work now, and the user is asked (`ask`) when there is some. A status that cannot be
 * fetched does not stop the suspend: its own reply reports any failure.
 */
export async function confirmSuspend(
  api: Pick<ICkptApi, 'status'>,
  kernelId: string,
  ask: (warning: string) => Promise<boolean>
): Promise<boolean> {
  let warning: string | null = null;
  try {
    const reply = await api.status(kernelId);
    warning = suspendWarning(reply.kernels.find(k => k.kernel_id === kernelId));
  } catch {
    return true;
  }
  return warning === null || ask(warning);
}

/** Background work ends without any kernel message: poll the status while there is some. */
export function endsWithoutMessage(status: IKernelStatus | undefined): boolean {
  return (status?.background_work ?? []).length > 0;
}
