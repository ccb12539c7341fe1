/** What the status bar says about a notebook's kernel, from `GET /api/ckpt/status`. */

import { ISignal, Signal } from '@lumino/signaling';

import {
  exactTime,
  formatBytes,
  formatDuration,
  relativeTime,
  shortId
} from './format';
import { Refresher } from './refresher';
import {
  CkptState,
  ICkptApi,
  ICkptEvent,
  IGpuDemand,
  IKernelStatus,
  IProgress,
  IStatusReply,
  IStoreHealth
} from './types';

export interface IStatusText {
  state:
    | 'running'
    | 'blocked'
    | 'suspending'
    | 'suspended'
    | 'restoring'
    | 'waiting';
  /** Short text for the status bar. */
  text: string;
  /** Longer explanation for hover and screen readers. */
  title: string;
}

/** What the server says while a kernel works on a request: not a reason it is never
 * suspended (its idle clock starts when the work ends). */
const WORKING = /^the kernel is (busy|starting)$/;

/**
 * Describe one kernel. `fetchedAt` is when `status` was fetched and `now` the current
 * time (ms), so the countdown runs between fetches; `restoringSince` is when a message
 * that restores the kernel was sent, if one was. `clientSees`: this page's own
 * connection follows the kernel's activity (JupyterLab shows it busy or idle beside):
 * the server's "the kernel is busy", read on a socket of its own that lags it (right
 * after the cell that restored the kernel, say), is then left out. A cell that runs is
 * no reason the kernel is not suspended: its idle clock starts when the cell ends.
 */
export function describeKernel(
  status: IKernelStatus,
  fetchedAt: number,
  now: number,
  restoringSince?: number,
  progress?: IProgress,
  clientSees = false
): IStatusText {
  // waiting for GPU memory comes first: a restore that waits has not started yet
  if (status.gpu_demand) {
    return waitingText(status.gpu_demand, (now - fetchedAt) / 1000);
  }
  if (status.state === 'restoring' || restoringSince !== undefined) {
    const elapsed = formatDuration(
      (now - (restoringSince ?? fetchedAt)) / 1000
    );
    const image = status.image ? ` from image ${status.image}` : '';
    return {
      state: 'restoring',
      text:
        progress?.phase === 'restore'
          ? progressText(progress)
          : `Restoring… ${elapsed}`,
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
      text:
        progress?.phase === 'suspend' ? progressText(progress) : 'Suspending…',
      title:
        'Writing the kernel to an image; it shuts down when the image is saved.'
    };
  }
  if (progress?.phase === 'checkpoint' || progress?.phase === 'resume') {
    return {
      state: 'running',
      text: progressText(progress),
      title:
        progress.phase === 'checkpoint'
          ? "Writing the kernel's variables to an image; the kernel keeps running."
          : "Reading the kernel's variables from the image it resumes."
    };
  }
  const gpuBytes = status.gpu?.bytes ?? 0;
  const gpu = status.gpu?.holds_gpu
    ? gpuBytes
      ? `GPU ${formatBytes(gpuBytes)}`
      : 'GPU'
    : null;
  // the server knows the kernel can never be suspended as it is: said first, as it is
  const wont = (status.blocked_by ?? []).find(b => b.startsWith(WONT_SUSPEND));
  if (wont) {
    return {
      state: 'blocked',
      text: [gpu, wont].filter(Boolean).join(' · '),
      title: `${wont}, so its state would be lost. Delete those variables, or leave them out of saves with %ckpt exclude followed by their names; the next save lifts this.`
    };
  }
  const failure =
    status.last_failure?.action === 'suspend' ? status.last_failure : null;
  const lost = Object.entries(failure?.lost ?? {});
  const blockers = failure
    ? [failure.reason]
    : (status.blocked_by ?? []).filter(b => !(clientSees && WORKING.test(b)));
  if (blockers.length > 0) {
    const first = lost.length
      ? unsaveableText(lost[0][0], lost[0][1])
      : plainBlocker(blockers[0]);
    const more = lost.length > 1 ? ` and ${lost.length - 1} more` : '';
    const why = lost.length
      ? `${lost.map(([name, reason]) => unsaveableText(name, reason)).join('; ')}. Delete ${lost.length === 1 ? 'it' : 'them'} in the notebook, or exclude ${lost.length === 1 ? 'it' : 'them'} from saved state, to let the kernel be suspended`
      : blockers.map(plainBlocker).join('; ');
    return {
      state: 'blocked',
      text: [gpu, `Not suspended: ${first}${more}`].filter(Boolean).join(' · '),
      title: `The kernel is not suspended when idle: ${why}.`
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

const DEMANDS: Record<IGpuDemand['source'], string> = {
  spec: 'Its kernel spec needs',
  restore: 'Its restore needs',
  kernel: 'It asked for'
};

/** "Waiting for a GPU: 2 ahead of you", with what the kernel waits for in the title. */
export function waitingText(demand: IGpuDemand, since: number): IStatusText {
  const device = demand.device === null ? '' : ` on GPU ${demand.device}`;
  const waited = formatDuration(demand.waiting_seconds + Math.max(0, since));
  return {
    state: 'waiting',
    text: demand.message,
    title: `${DEMANDS[demand.source]} ${formatBytes(demand.bytes)} of GPU memory${device}; idle kernels are suspended to make room, and it goes on as soon as the memory is free (waiting for ${waited}).`
  };
}

const PHASES: Record<IProgress['phase'], string> = {
  checkpoint: 'Saving kernel state',
  suspend: 'Suspending',
  restore: 'Restoring',
  resume: 'Resuming'
};

/** "Restoring · 1.2 GB of 4.0 GB": how far an image is written or read. */
export function progressText(progress: IProgress): string {
  return `${PHASES[progress.phase]} · ${formatBytes(progress.done)} of ${formatBytes(progress.total)}`;
}

/** How the server's reason begins when variables that cannot be saved (under
 * `on_unsaveable = "keep"`) keep the kernel from ever being suspended. */
const WONT_SUSPEND = "Won't suspend:";

/** What the monitor's reasons (which name the settings behind them) say in plain words. */
const PLAIN_BLOCKERS: [RegExp, string][] = [
  [/^idle suspension is off\b/, 'idle suspension is off'],
  [/ is in exclude_kernel_names$/, 'kernels of this kind are never suspended'],
  [/^\d+ client\(s\) connected\b/, 'it is open in a browser tab'],
  [/^holds no GPU memory\b/, 'it uses no GPU'],
  [/^holds less than min_gpu_memory_mb\b/, 'it uses little GPU memory'],
  [
    /^the activity check failed\b/,
    'the kernel did not say whether it is working'
  ],
  [/^variables cannot be saved\b/, 'some variables cannot be saved']
];

/** A reason the server gives for not suspending a kernel, for the status bar; the full
 * reason stays in the hover text. */
export function plainBlocker(reason: string): string {
  const plain = PLAIN_BLOCKERS.find(([pattern]) => pattern.test(reason));
  return plain ? plain[1] : reason.replace(/`([^`]*)`/g, '$1');
}

/** Why one variable cannot be saved, in plain words: "fh is an open file",
 * "gen is a generator, which cannot be saved". */
export function unsaveableText(name: string, reason: string): string {
  const pickled = /cannot pickle '([\w.]+)' object/.exec(reason);
  const what = /cannot save an open file/.test(reason)
    ? 'is an open file'
    : pickled
      ? `is a ${pickled[1]}, which cannot be saved`
      : 'cannot be saved';
  return `${name} ${what}`;
}

/** Up to how many variable names a notification or a button names. */
const MAX_NAMES = 3;

/** "gen, sock and lock", or "gen, sock, lock and 2 more": short enough for a
 * notification (JupyterLab cuts its text at 140 characters). */
export function nameList(names: readonly string[]): string {
  if (names.length <= 1) {
    return names.join('');
  }
  if (names.length <= MAX_NAMES) {
    return `${names.slice(0, -1).join(', ')} and ${names[names.length - 1]}`;
  }
  return `${names.slice(0, MAX_NAMES).join(', ')} and ${names.length - MAX_NAMES} more`;
}

/** The `%ckpt exclude` line that leaves the variables out of the kernel's images, run
 * in the kernel (the extension loaded first: it may not be yet). */
export function excludeCode(names: readonly string[]): string {
  return `%load_ext jupyter_ckpt\n%ckpt exclude ${names.join(' ')}`;
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

/**
 * Comms a frontend opens on every connect (the server's `PROBE_COMMS`): ipywidgets 8's
 * control comm, which a suspended kernel closes without waking.
 */
const PROBE_COMMS = new Set(['jupyter.widget.control']);

/** What of a comm message decides whether it wakes a kernel. */
export interface ICommFields {
  comm_id?: unknown;
  target_name?: unknown;
}

/**
 * Whether sending this message to a suspended kernel restores it. `probes` holds the
 * ids of the probe comms opened so far (filled here), whose messages do not wake it.
 */
export function wakesKernel(
  channel: string,
  msgType: string,
  content: ICommFields = {},
  probes: Set<string> = new Set()
): boolean {
  const commId = String(content.comm_id);
  if (msgType === 'comm_open' && PROBE_COMMS.has(String(content.target_name))) {
    probes.add(commId);
  }
  if (
    (msgType === 'comm_open' || msgType === 'comm_msg') &&
    probes.has(commId)
  ) {
    return false;
  }
  return channel === 'shell' && WAKING.has(msgType);
}

/** The status bar's short text when the server cannot use its store (unreachable, read-only, full), or null. */
export function storeProblem(reply: IStatusReply): string | null {
  const store = reply.store;
  return store && !store.ok ? unavailable(store.error) : null;
}

function unavailable(reason: string | null | undefined): string {
  return `Store unavailable: ${reason ?? 'no answer'}`;
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

  /** Why the server cannot use its store, or null while it can. */
  /** The store's health and use, as the server last said (null: not known). */
  get store(): IStoreHealth | null {
    return this._store;
  }

  get storeProblem(): string | null {
    return this._storeProblem;
  }

  kernel(kernelId: string): IKernelStatus | undefined {
    return this._kernels.get(kernelId);
  }

  isSuspended(kernelId: string): boolean {
    return this._kernels.get(kernelId)?.state === 'suspended';
  }

  /** Whether the server said the kernel was shut down (a state event), which this
   * page's session and kernel lists may not know yet. */
  isGone(kernelId: string): boolean {
    return this._gone.has(kernelId);
  }

  /** Follow a state event: the kernel's state, as the server says now, shown at once;
   * the rest of its status comes with the next refresh. A reply asked for before the
   * event does not bring the old state back. */
  noteState(kernelId: string, state: CkptState | 'gone', now: number): void {
    this._noted.set(kernelId, now);
    this._restoring.delete(kernelId);
    if (state === 'gone') {
      this._gone.add(kernelId);
      this._kernels.delete(kernelId);
      this._fetchedAt.delete(kernelId);
      this._progress.delete(kernelId);
    } else {
      this._gone.delete(kernelId);
      const known = this._kernels.get(kernelId);
      // a suspended or restoring kernel runs nothing: its blockers and countdown went
      // with its process
      this._kernels.set(
        kernelId,
        known && state === 'running'
          ? { ...known, state }
          : { kernel_id: kernelId, kernel_name: known?.kernel_name, state }
      );
      this._fetchedAt.set(kernelId, now);
    }
    this._changed.emit();
  }

  /** Follow a store event: whether the store can be used, and why not, at once. */
  noteStore(ok: boolean, reason: string | undefined, now: number): void {
    this._storeNotedAt = now;
    this._storeProblem = ok ? null : unavailable(reason);
    this._changed.emit();
  }

  /** Forget the kernels that are gone (shut down), without asking the server: its
   * status route checks every kernel it lists, which a kernel just starting must not
   * get while its first connection is made. */
  retain(running: ReadonlySet<string>): void {
    let gone = false;
    for (const id of [...this._kernels.keys()]) {
      if (!running.has(id)) {
        this._kernels.delete(id);
        this._fetchedAt.delete(id);
        gone = true;
      }
    }
    if (gone) {
      this._changed.emit();
    }
  }

  /** A message that needs the kernel was sent to it while it was suspended: it reads as
   * restoring until the server, asked after that, says whether it is. */
  markRestoring(kernelId: string, now: number): void {
    if (this.isSuspended(kernelId) && !this._restoring.has(kernelId)) {
      this._restoring.set(kernelId, now);
      this._changed.emit();
    }
  }

  /** What to show for the kernel; `clientSees`: see `describeKernel`. */
  describe(
    kernelId: string,
    now: number,
    clientSees = false
  ): IStatusText | null {
    const status = this._kernels.get(kernelId);
    return status
      ? describeKernel(
          status,
          this._fetchedAt.get(kernelId) ?? now,
          now,
          this._restoring.get(kernelId),
          this._progress.get(kernelId),
          clientSees
        )
      : null;
  }

  /** How far the kernel's image is written or read, while that is under way. */
  progress(kernelId: string): IProgress | undefined {
    return this._progress.get(kernelId);
  }

  /** Follow a server event: progress while an image is written or read, until the
   * event of the action's outcome for the same kernel ends it. */
  noteEvent(event: ICkptEvent): void {
    const id = event.kernel_id;
    if (!id) {
      return;
    }
    if (event.action === 'progress' && event.phase) {
      this._progress.set(id, {
        phase: event.phase,
        done: event.bytes_done ?? 0,
        total: event.bytes_total ?? 0
      });
      this._changed.emit();
    } else if (this._progress.delete(id)) {
      this._changed.emit();
    }
  }

  /** Fetch the status of every kernel, or of `kernelId` alone (its background work and
   * a failed suspend's variables checked now); concurrent calls for the same kernels
   * share one request. Rejects when it fails. */
  refresh(kernelId?: string): Promise<void> {
    const key = kernelId ?? '';
    let loads = this._loads.get(key);
    if (!loads) {
      loads = new Refresher(() => this._load(kernelId));
      this._loads.set(key, loads);
    }
    return loads.run();
  }

  private async _load(kernelId?: string): Promise<void> {
    const asked = Date.now();
    try {
      const reply = await this._api.status(kernelId);
      const fetchedAt = Date.now();
      const ids =
        kernelId === undefined ? [...this._kernels.keys()] : [kernelId];
      // what a state event said after the request was made is newer than the reply
      const newer = (id: string) => (this._noted.get(id) ?? -Infinity) >= asked;
      for (const id of ids.filter(id => !newer(id))) {
        this._kernels.delete(id);
        this._fetchedAt.delete(id);
      }
      if (this._storeNotedAt < asked) {
        this._storeProblem = storeProblem(reply);
      }
      this._store = reply.store ?? null;
      for (const kernel of reply.kernels) {
        const id = kernel.kernel_id;
        if (newer(id)) {
          const state = this._kernels.get(id)?.state;
          if (state === undefined || state !== kernel.state) {
            continue; // gone, or moved on since
          }
        }
        this._kernels.set(id, kernel);
        this._fetchedAt.set(id, fetchedAt);
      }
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
      // a suspend or restore the server no longer reports under way has ended, even if
      // its outcome's event was missed (a reconnect): its progress goes with it
      for (const [id, progress] of [...this._progress]) {
        const state = this._kernels.get(id)?.state;
        if (
          (progress.phase === 'suspend' && state !== 'suspending') ||
          (progress.phase === 'restore' && state !== 'restoring')
        ) {
          this._progress.delete(id);
        }
      }
      this._available = true;
    } catch (reason) {
      this._available = false;
      this._kernels.clear();
      this._fetchedAt.clear();
      throw reason;
    } finally {
      this._changed.emit();
    }
  }

  private _changed = new Signal<this, void>(this);
  private _storeProblem: string | null = null;
  private _store: IStoreHealth | null = null;
  private _kernels = new Map<string, IKernelStatus>();
  private _restoring = new Map<string, number>();
  private _progress = new Map<string, IProgress>();
  private _fetchedAt = new Map<string, number>();
  private _available = false;
  private _loads = new Map<string, Refresher>();
  // kernel id -> when its last state event came; when the last store event came
  private _noted = new Map<string, number>();
  private _storeNotedAt = -Infinity;
  private _gone = new Set<string>();
}

/**
 * What to tell the user about a server event, if anything: a restore that failed (the
 * kernel runs without its variables), as the lead of a failure and its whole reason.
 * Failed idle suspensions show in the status bar instead, and failed commands report
 * themselves.
 */
export function eventNotice(
  event: ICkptEvent
): { lead: string; why: string } | null {
  if (event.action === 'restore' && event.status === 'error') {
    return {
      lead: `Could not restore kernel ${shortId(event.kernel_id ?? '')}`,
      why: `${event.msg ?? 'unknown error'}. The kernel runs without its saved variables; the image is kept.`
    };
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

/** Why a command cannot run: a few words for its label, a sentence for its caption. */
export interface IBlocked {
  short: string;
  long: string;
}

/**
 * Why "Save Kernel State Now" and "Suspend Kernel Now" cannot run for the current
 * notebook's kernel (`kernelId`, null when there is none), or null when they can.
 */
export function commandBlocked(
  kernelId: string | null,
  isSuspended: (id: string) => boolean,
  serverAvailable: boolean
): IBlocked | null {
  if (kernelId === null) {
    return {
      short: 'no notebook kernel',
      long: 'open a notebook that has a running kernel.'
    };
  }
  if (isSuspended(kernelId)) {
    return {
      short: 'kernel suspended',
      long: 'the kernel is suspended and its state saved; run a cell to resume it.'
    };
  }
  if (!serverAvailable) {
    return {
      short: 'server extension not answering',
      long: 'the jupyter_ckpt server extension does not answer.'
    };
  }
  return null;
}

/**
 * The hover text of a kernel "recovered after a crash" (its server stopped without
 * suspending it; it comes back from its last autosave), or null for any other kernel.
 */
export function recoveredTitle(
  status: IKernelStatus | undefined
): string | null {
  const recovered = status?.recovered;
  if (!recovered) {
    return null;
  }
  const crashed = recovered.crashed_after
    ? ` The server stopped after ${exactTime(recovered.crashed_after)} without suspending it.`
    : ' The server stopped without suspending it.';
  return `Kernel state autosaved ${exactTime(recovered.autosave_at)}.${crashed} Changes made after the autosave are not in it.`;
}
