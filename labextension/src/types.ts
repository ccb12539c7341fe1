/**
 * Shapes of the jupyter_ckpt_server REST answers (DESIGN section 5). Optional fields are
 * ones an older server, or an image without GPU state, may leave out.
 */

export type Verdict = 'compatible' | 'warnings' | 'incompatible';

export interface ICompatibility {
  verdict: Verdict;
  reasons: string[];
}

/** One entry of `GET /api/ckpt/images`. */
export interface IImage {
  id: string;
  /** "saved", "suspended" (a suspended kernel needs it), "restore-failed" (kept for a
   * retry by the kernel whose restore of it failed), "autosave" (a running kernel's
   * crash-recovery record names it) or "invalid" (unreadable). The server deletes only
   * "saved" images. */
  state: 'saved' | 'suspended' | 'restore-failed' | 'autosave' | 'invalid';
  name?: string;
  created?: string;
  /** The image this one's kernel was restored from or saved before, if any. */
  parent?: string | null;
  kernel_id?: string | null;
  /** The notebook the kernel was started for, as its path then. */
  notebook_path?: string | null;
  /** The notebook file's id (the server's file ID service): it follows the file
   * through renames and moves, and a new file of the old name gets another. */
  notebook_id?: string | null;
  /** That file's API path now; null when it is gone (or the image has no id). */
  notebook_current_path?: string | null;
  devices?: string[];
  size?: { logical?: number; written?: number };
  variables_count?: number;
  /** The names of its variables (saved or not), to tell what changed between images. */
  variable_names?: string[];
  lost?: string[];
  /** The variables left out on purpose (excluded from the kernel's saved state). */
  excluded?: string[];
  compatibility?: ICompatibility;
  /** GPU the kernel held when the image was written, where the server knows it. */
  gpu?: { model?: string; memory_bytes?: number };
  /** Why an invalid image could not be read. */
  error?: string;
  /** What wrote it: "autosave", "idle" (an idle suspend), "manual" (Save Now, Suspend
   * Now, `%ckpt save`), "shutdown" (the server stopped) or "replaced" (another image was
   * resumed into its notebook); null for images older servers wrote. */
  trigger?: ImageTrigger | null;
  /** The running kernels that run from it (restored or resumed from it, or last saved
   * to it), each with its sessions. */
  in_use_by?: IInUse[];
}

export type ImageTrigger =
  'autosave' | 'idle' | 'manual' | 'shutdown' | 'replaced';

/** A running kernel that runs from an image, and the sessions it is known by. */
export interface IInUse {
  kernel_id: string;
  sessions: { name?: string; path?: string; type?: string }[];
}

export interface IVariable {
  name: string;
  type: string;
  status: 'saved' | 'imported' | 'lost' | 'excluded';
  bytes?: number;
  devices?: string[];
  reason?: string;
  module?: string;
  /** Arrays and tensors: their shape ([] for a scalar) and dtype. */
  shape?: number[];
  dtype?: string;
}

/** `GET /api/ckpt/images/{id}`. */
export interface IImageDetails extends IImage {
  variables: IVariable[];
}

export type CkptState =
  'running' | 'suspending' | 'suspended' | 'restoring' | 'restore-failed';

/** A kernel's wait for GPU memory (GPU demand): `message` is "Waiting for a GPU: 2
 * ahead of you"; `source` is what asked (a kernel spec, a restore, the kernel). */
export interface IGpuDemand {
  ahead: number;
  bytes: number;
  device: number | null;
  source: 'spec' | 'restore' | 'kernel';
  waiting_seconds: number;
  message: string;
}

/** One kernel of `GET /api/ckpt/status`: running kernels carry the idle monitor's view. */
export interface IKernelStatus {
  kernel_id: string;
  kernel_name?: string;
  state: CkptState;
  execution_state?: string;
  idle_seconds?: number;
  idle_timeout?: number;
  seconds_until_suspend?: number | null;
  blocked_by?: string[];
  /** The background work among `blocked_by` (threads, tasks, child processes, busy
   * GPUs): what suspending the kernel now would stop. */
  background_work?: string[];
  gpu?: { bytes?: number; holds_gpu?: boolean };
  last_failure?: {
    action: string;
    reason: string;
    at: string;
    /** The variables a failed suspend could not save (name -> why), while they still
     * hold those values: the server forgets the failure once they are all gone. */
    lost?: Record<string, string>;
  } | null;
  /** Its place in a GPU demand queue while it waits for GPU memory, else null. */
  gpu_demand?: IGpuDemand | null;
  /** Suspended kernels: their image, when they were suspended and the GPU memory freed. */
  image?: string;
  suspended_at?: string;
  gpu_bytes?: number;
  /** A kernel that was running when its server crashed, back from its last autosave. */
  recovered?: { autosave_at: string; crashed_after?: string | null };
}

/** Whether the server reaches its store, and since when; how much room it uses. */
export interface IStoreHealth {
  url: string;
  ok: boolean;
  error: string | null;
  since: string;
  /** Null while the store cannot be read; absent from older servers. */
  usage?: IStoreUsage | null;
}

/** The bytes the store's images hold (each chunk counted once, with the image that
 * first wrote it), against `ImageStore.quota_bytes`; a local store's file system. */
export interface IStoreUsage {
  bytes: number;
  images: number;
  quota_bytes: number | null;
  disk_bytes: number | null;
  disk_free_bytes: number | null;
}

export interface IStatusReply {
  kernels: IKernelStatus[];
  store?: IStoreHealth | null;
}

/** `POST /api/ckpt/images/{id}/resume`. */
export interface IResumeReply {
  kernel: { id: string; name: string };
  session: { id: string; path: string } | null;
  restore: {
    missing?: Record<string, string>;
    /** Of `missing`, those left out on purpose (not a failure). */
    excluded?: string[];
    /** The cell (In [n]) that made each missing variable, where the history says. */
    cells?: Record<string, number>;
    warnings?: string[];
  };
}

/** `POST /api/ckpt/kernels/{id}/checkpoint` and `.../suspend`. */
export interface IWriteReply {
  id: string;
  name: string;
  bytes: number;
  lost: Record<string, string>;
  /** Nothing changed since the kernel's newest image: no image was written, `id` is
   * that image. */
  unchanged?: boolean;
}

/** A jupyter_events record of the schema below, as the event stream delivers it. */
export interface ICkptEvent {
  schema_id: string;
  action:
    | 'checkpoint'
    | 'suspend'
    | 'restore'
    | 'resume'
    | 'delete'
    | 'progress'
    | 'state'
    | 'store'
    | 'images';
  status: 'success' | 'error' | 'running' | 'skipped';
  kernel_id?: string;
  image_id?: string;
  msg?: string;
  /** Progress events: the action under way, and how far its image's bytes are. */
  phase?: 'checkpoint' | 'suspend' | 'restore' | 'resume';
  bytes_done?: number;
  bytes_total?: number;
  /** State events: the kernel's state from now on; gone: shut down. */
  state?: CkptState | 'gone';
  /** Restore events: the variables the image left out on purpose, and the cell that
   * made each. */
  excluded?: string[];
  cells?: Record<string, number>;
}

/** How far a kernel's image is written or read, from its latest progress event. */
export interface IProgress {
  phase: NonNullable<ICkptEvent['phase']>;
  done: number;
  total: number;
}

export const EVENT_SCHEMA = 'https://events.jupyter.org/jupyter_ckpt/v1';

/** The REST calls the models and actions make; `CkptApi` implements it over HTTP. */
export interface ICkptApi {
  listImages(): Promise<IImage[]>;
  getImage(id: string): Promise<IImageDetails>;
  deleteImage(id: string): Promise<void>;
  resume(
    id: string,
    options: { path?: string; kernel_name?: string }
  ): Promise<IResumeReply>;
  checkpoint(kernelId: string, name?: string): Promise<IWriteReply>;
  suspend(kernelId: string): Promise<IWriteReply>;
  /** Every kernel; with `kernelId`, that kernel alone, its background work checked now. */
  status(kernelId?: string): Promise<IStatusReply>;
}
