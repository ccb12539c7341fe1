/** The saved-sessions list: images and suspended kernels, newest first, filterable. */

import { ISignal, Signal } from '@lumino/signaling';

import { baseName, formatBytes, shortenIds, shortId } from './format';
import { matchesFilter, parseFilter } from './listfilter';
import { Refresher } from './refresher';
import { ICkptApi, IImage, IVariable } from './types';

export interface ISessionRow {
  image: IImage;
  /** API path of the notebook (relative to the server root), when known. */
  notebook: string | null;
  /** The notebook file the image was saved for is gone (deleted, or renamed outside
   * the server's view): `notebook` is where it was, and may be another file now. */
  notebookGone?: boolean;
  /** What the row is called: the notebook's file name, else the image's name or id. */
  title: string;
  /** The suspended kernel that needs this image, if any. */
  suspendedKernel: string | null;
  /** What the running kernels that run from this image are known by ("Console 3",
   * "A.ipynb"); empty when none does. */
  inUse: string[];
}

/** What the panel offers to do with a row's image. */
export type RowAction = 'resume' | 'details' | 'delete';

/**
 * The actions of a row. An image that fails verification (signed with a different
 * secret, altered, unreadable) gets none: the server refuses to restore or delete an
 * image it cannot vouch for, which may well be someone else's.
 */
export function rowActions(image: IImage): RowAction[] {
  return image.state === 'invalid' ? [] : ['resume', 'details', 'delete'];
}

/**
 * Why the row's image cannot be deleted now, or null: the server keeps an image that a
 * suspended kernel (or a kernel whose restore of it failed) still needs.
 */
export function deleteBlocked(image: IImage): string | null {
  if (image.state === 'suspended') {
    return 'A suspended kernel needs this image to come back. Shut that kernel down, or run a cell in its notebook, to be able to delete it.';
  }
  if (image.state === 'restore-failed') {
    return 'Kept for a kernel whose restore of it failed, to retry. Shut that kernel down, or restart it, to be able to delete it.';
  }
  if (image.state === 'autosave') {
    return "Needed by the running kernel's autosave, to recover it after a crash. Its next autosave, or shutting the kernel down, releases it.";
  }
  return null;
}

/**
 * Why the server refused to delete an image, in words that fit the kernel holding it:
 * a running kernel keeps it as its crash-recovery autosave (nothing to resume), a
 * suspended one needs it to come back. Other refusals pass through, ids shortened.
 */
export function refusalText(message: string): string {
  const held = /needed by (running|suspended) kernel ([0-9a-f-]+)/.exec(
    message
  );
  if (!held) {
    return shortenIds(message);
  }
  const kernel = shortId(held[2]);
  return held[1] === 'running'
    ? `running kernel ${kernel} keeps it to recover from a crash. Its next autosave, or shutting that kernel down, releases it.`
    : `suspended kernel ${kernel} needs it to come back. Run a cell in its notebook, or shut that kernel down, first.`;
}

/** "checkpoint-3 (3f9a2c51)": how a confirmation or notification names an image. */
export function imageLabel(image: IImage): string {
  const id = shortId(image.id);
  const name = image.name && !MACHINE_NAME.test(image.name) ? image.name : null;
  return name ? `${name} (${id})` : id;
}

/** The names an image of a kernel without a notebook gets (a console resumed into, a
 * kernel started over the REST API): they say nothing its id does not. */
const MACHINE_NAME = /^(kernel-[0-9a-f]{8}|session)$/;

/**
 * The API path of a notebook the kernel recorded as a file-system path (kernels see
 * `JPY_SESSION_NAME`, an absolute path); null when it lies outside the server root.
 */
export function apiPath(
  notebookPath: string,
  serverRoot: string
): string | null {
  const root = serverRoot.replace(/\/+$/, '');
  if (!notebookPath.startsWith('/')) {
    return notebookPath;
  }
  return notebookPath.startsWith(root + '/')
    ? notebookPath.slice(root.length + 1)
    : null;
}

/** A file renamed in this JupyterLab (the contents manager's fileChanged): images saved
 * under `from` before `at` belong to `to` now. A directory's rename carries its files. */
export interface IRename {
  from: string;
  to: string;
  at: number;
}

/** `path` after the renames made since `created` (ms), in the order they were made. */
export function followRenames(
  path: string,
  created: number,
  renames: readonly IRename[]
): string {
  let current = path;
  for (const { from, to, at } of renames) {
    if (created > at) {
      continue; // saved after the rename: a new file of the old name
    }
    if (current === from) {
      current = to;
    } else if (current.startsWith(from + '/')) {
      current = to + current.slice(from.length);
    }
  }
  return current;
}

/** What the rows know of the live sessions and this JupyterLab's file renames. */
export interface ILiveContext {
  /** Notebook sessions' kernels: kernel id -> notebook path (follows renames). */
  kernelPaths: ReadonlyMap<string, string>;
  /** Console sessions' kernels: kernel id -> the console's name ("Console 3"). */
  consoles?: ReadonlyMap<string, string>;
  renames?: readonly IRename[];
}

/** How many parent links a console's title follows back to a notebook's image. */
const MAX_PARENTS = 20;

/**
 * A console kernel's title: "Console 3 (from B.ipynb)". Its name comes from its live
 * session, else from the session name its kernel recorded; the notebook from the first
 * image up its parent chain (the image it was resumed from) that names one.
 */
function consoleTitle(
  image: IImage,
  byId: ReadonlyMap<string, IImage>,
  notebookOf: (image: IImage) => string | null,
  context: ILiveContext
): string {
  const recorded = image.notebook_path ? baseName(image.notebook_path) : '';
  const name =
    (image.kernel_id && context.consoles?.get(image.kernel_id)) ||
    (/^Console \d+$/.test(recorded) ? recorded : 'Console');
  let parent = image.parent ? byId.get(image.parent) : undefined;
  for (let i = 0; parent && i < MAX_PARENTS; i++) {
    const source = notebookOf(parent);
    if (source) {
      return `${name} (from ${baseName(source)})`;
    }
    parent = parent.parent ? byId.get(parent.parent) : undefined;
  }
  return image.kernel_id && name === 'Console'
    ? `Console of kernel ${shortId(image.kernel_id)}`
    : name;
}

/**
 * The sessions a user knows the kernels that run from `image` by: a notebook's file
 * name (its live session, which follows renames), a console's name ("Console 3"), else
 * the session the server lists, else the kernel's short id.
 */
export function inUseNames(image: IImage, context: ILiveContext): string[] {
  const names: string[] = [];
  for (const use of image.in_use_by ?? []) {
    const notebook = context.kernelPaths.get(use.kernel_id);
    const console = context.consoles?.get(use.kernel_id);
    const known = use.sessions.map(s =>
      s.type === 'notebook' && s.path ? baseName(s.path) : (s.name ?? '')
    );
    const name =
      (notebook && baseName(notebook)) ||
      console ||
      known.find(n => n) ||
      `kernel ${shortId(use.kernel_id)}`;
    if (!names.includes(name)) {
      names.push(name);
    }
  }
  return names;
}

/**
 * Rows for the images, newest first. A suspended kernel's notebook is taken from its live
 * session (`kernelPaths`), which follows renames; otherwise from the image's manifest,
 * carried through the renames made here since. Images of a console (no notebook file
 * recorded) are titled after the console and the notebook they came from.
 */
export function sessionRows(
  images: IImage[],
  live: ILiveContext,
  serverRoot: string
): ISessionRow[] {
  const notebookOf = (image: IImage): string | null => {
    if (image.notebook_id && image.notebook_current_path) {
      return image.notebook_current_path; // the server follows the file
    }
    const recorded = image.notebook_path
      ? apiPath(image.notebook_path, serverRoot)
      : null;
    if (!recorded || !recorded.endsWith('.ipynb')) {
      return null;
    }
    // an image without a file id, or whose file is gone: the renames seen here are
    // all there is to go by (a gone file: where it was last seen)
    const created = Date.parse(image.created ?? '') || 0;
    return followRenames(recorded, created, live.renames ?? []);
  };
  const byId = new Map(images.map(image => [image.id, image]));
  const rows = images.map(image => {
    const kernel =
      image.state === 'suspended' ? (image.kernel_id ?? null) : null;
    const notebook =
      (kernel && live.kernelPaths.get(kernel)) || notebookOf(image);
    const console =
      !notebook && image.state !== 'invalid' && image.kernel_id
        ? consoleTitle(image, byId, notebookOf, live)
        : null;
    return {
      image,
      notebook,
      notebookGone:
        !!notebook &&
        !kernel &&
        !!image.notebook_id &&
        !image.notebook_current_path,
      title: notebook ? baseName(notebook) : console || image.name || image.id,
      suspendedKernel: kernel,
      inUse: inUseNames(image, live)
    };
  });
  const time = (row: ISessionRow) => Date.parse(row.image.created ?? '') || 0;
  return rows.sort((a, b) => time(b) - time(a));
}

/** One notebook (or console kernel): the row it shows, and its older images folded. */
export interface ISessionEntry {
  /** The image of its suspended kernel if it has one, else its newest image. */
  latest: ISessionRow;
  /** Its other images, newest first. */
  older: ISessionRow[];
}

/** What entry a row belongs to: its notebook file (by the file's id, which follows
 * renames; by its path for images without one), else the kernel that wrote it. */
function entryKey(row: ISessionRow): string {
  if (row.image.state !== 'invalid') {
    if (row.image.notebook_id) {
      return `file:${row.image.notebook_id}`;
    }
    if (row.notebook) {
      return `notebook:${row.notebook}`;
    }
    if (row.image.kernel_id) {
      return `kernel:${row.image.kernel_id}`;
    }
  }
  return `image:${row.image.id}`;
}

/** One entry per notebook, in the order of the rows (newest first). */
export function groupRows(rows: ISessionRow[]): ISessionEntry[] {
  const entries = new Map<string, ISessionRow[]>();
  for (const row of rows) {
    const key = entryKey(row);
    entries.set(key, [...(entries.get(key) ?? []), row]);
  }
  return [...entries.values()].map(group => {
    const latest = group.find(row => row.suspendedKernel) ?? group[0];
    return { latest, older: group.filter(row => row !== latest) };
  });
}

/** Rows that match the filter box's `query` (see `parseFilter`): by their notebook's
 * path or title, the image's name, its variables' names, or what wrote it. */
export function filterRows(rows: ISessionRow[], query: string): ISessionRow[] {
  const terms = parseFilter(query);
  if (!terms.length) {
    return rows;
  }
  return rows.filter(({ notebook, title, image }) =>
    matchesFilter(
      {
        notebook: [notebook, title],
        label: [image.name],
        var: image.variable_names ?? [],
        trigger: [image.trigger]
      },
      terms
    )
  );
}

export type LoadState = 'loading' | 'ready' | 'error';

/** What a row's note depends on: the image's state and the kernel that holds it. */
function noteCause(image: IImage | undefined): string {
  return image ? `${image.state} ${image.kernel_id ?? ''}` : '';
}

/** State of the panel: the image list, what is being searched, load errors. */
export class SavedSessionsModel {
  constructor(
    private readonly _api: Pick<ICkptApi, 'listImages'>,
    private readonly _live: () => Omit<ILiveContext, 'renames'>,
    private readonly _serverRoot: string
  ) {}

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get state(): LoadState {
    return this._state;
  }

  /** Why the last load failed. */
  /** Why the last load failed ('' after one that worked). */
  get error(): string {
    const failure = this._failure;
    if (failure === null) {
      return '';
    }
    return failure instanceof Error ? failure.message : String(failure);
  }

  /** What the last failed load threw (see `loadFailure`), to say which part failed. */
  get failure(): unknown {
    return this._failure;
  }

  get query(): string {
    return this._query;
  }

  set query(value: string) {
    this._query = value;
    this._changed.emit();
  }

  /** Every row, unfiltered. */
  get allRows(): ISessionRow[] {
    return this._rows;
  }

  get rows(): ISessionRow[] {
    return filterRows(this._rows, this._query);
  }

  /** The live notebook sessions' kernels: kernel id -> notebook path. */
  get kernelPaths(): ReadonlyMap<string, string> {
    return this._live().kernelPaths;
  }

  /** How many entries there are without the filter. */
  get entryCount(): number {
    return groupRows(this._rows).length;
  }

  /** A file (or directory) renamed in this JupyterLab: the images saved under its old
   * path before now follow it, and the rows are rebuilt at once. */
  noteRename(from: string, to: string, at = Date.now()): void {
    this._renames.push({ from, to, at });
    this._rebuild();
  }

  /** The sessions or kernels changed: a row's state and title may have too. */
  liveChanged(): void {
    this._rebuild();
  }

  /** Whether an action (a resume, a delete) runs on the image's row. */
  isActing(imageId: string): boolean {
    return this._acting.has(imageId);
  }

  /** Run `action` on the image's row unless one already runs there (a second click
   * while the first still works); the row's buttons are disabled meanwhile. */
  async act(imageId: string, action: () => Promise<void>): Promise<void> {
    if (this._acting.has(imageId)) {
      return;
    }
    this._acting.add(imageId);
    this._changed.emit();
    try {
      await action();
    } finally {
      this._acting.delete(imageId);
      this._changed.emit();
    }
  }

  /** The rows that match the filter, one entry per notebook. */
  get entries(): ISessionEntry[] {
    return groupRows(this.rows);
  }

  /** Show `message` on an image's row, such as why a delete was refused. The note
   * stays while its cause may still apply: it goes with the image, at the next action
   * on the row (`clearNote`), and at the first list that shows the image in another
   * state or held by another kernel (the kernel that pinned it is gone, say). */
  note(imageId: string, message: string): void {
    const image = this._rows.find(row => row.image.id === imageId)?.image;
    this._notes.set(imageId, { message, cause: noteCause(image) });
    this._changed.emit();
  }

  noteFor(imageId: string): string | undefined {
    return this._notes.get(imageId)?.message;
  }

  /** Forget the row's note: the user is acting on the row again. */
  clearNote(imageId: string): void {
    if (this._notes.delete(imageId)) {
      this._changed.emit();
    }
  }

  /** Load the list; a call while a load runs gets the next one (see `Refresher`). A
   * failed refresh keeps the rows that were shown and says why. */
  refresh(): Promise<void> {
    const done = this._loads.run().finally(() => this._changed.emit());
    this._changed.emit();
    return done;
  }

  /** Whether a refresh is in flight. */
  get busy(): boolean {
    return this._loads.busy;
  }

  private async _load(): Promise<void> {
    try {
      const images = await this._api.listImages();
      this._images = images;
      this._rows = this._rowsOf(images);
      // a note no longer applies once its image is gone or has changed state
      const causes = new Map(images.map(image => [image.id, noteCause(image)]));
      for (const [id, note] of [...this._notes]) {
        if (causes.get(id) !== note.cause) {
          this._notes.delete(id);
        }
      }
      this._state = 'ready';
      this._failure = null;
    } catch (reason) {
      this._state = 'error';
      this._failure = reason;
    }
  }

  private _rowsOf(images: IImage[]): ISessionRow[] {
    return sessionRows(
      images,
      { ...this._live(), renames: this._renames },
      this._serverRoot
    );
  }

  private _rebuild(): void {
    this._rows = this._rowsOf(this._images);
    this._changed.emit();
  }

  private _changed = new Signal<this, void>(this);
  private _images: IImage[] = [];
  private _renames: IRename[] = [];
  private _acting = new Set<string>();
  private _state: LoadState = 'loading';
  private _failure: unknown = null;
  private _query = '';
  private _rows: ISessionRow[] = [];
  private _notes = new Map<string, { message: string; cause: string }>();
  private _loads = new Refresher(() => this._load());
}

/** The name an image gets when none is given (the kernel side's `_default_name`): the
 * notebook's file name without extension, else "kernel-<8 hex>" or "session". */
function defaultName(notebook: string | null): string | null {
  if (!notebook) {
    return null;
  }
  const stem = baseName(notebook).replace(/\.[^.]*$/, '');
  return stem
    .replace(/[^A-Za-z0-9._-]+/g, '-')
    .replace(/^[-._]+|[-._]+$/g, '')
    .slice(0, 128);
}

/** Whether the row's image was given a name of its own (`%ckpt save NAME`). */
export function isNamed(row: ISessionRow): boolean {
  const name = row.image.name;
  return (
    !!name &&
    name !== defaultName(row.notebook) &&
    // a console's kernel is named after the console it was started for ("Console-1")
    name !== defaultName(row.image.notebook_path ?? null) &&
    !MACHINE_NAME.test(name)
  );
}

/** Up to how many variable names "what changed" lists on each side. */
const MAX_NAMED = 3;

/**
 * What changed from the image before it (`previous`, older) to this one. With the
 * variables' names (servers that list them), the names added and removed when they are
 * few: "+1.2 MB; new: df, model; gone: tmp", else how many: "+1.2 MB; 5 new variables".
 * Without, the counts: "+1.2 MB, 2 variables more than the one before". "same size and
 * variables as the one before" when nothing moved.
 */
export function changeSince(image: IImage, previous: IImage): string {
  const parts: string[] = [];
  const size = (image.size?.logical ?? 0) - (previous.size?.logical ?? 0);
  if (size !== 0) {
    parts.push(`${size > 0 ? '+' : '−'}${formatBytes(Math.abs(size))}`);
  }
  const now = image.variable_names;
  const before = previous.variable_names;
  if (now && before) {
    const added = now.filter(name => !before.includes(name));
    const gone = before.filter(name => !now.includes(name));
    const plural = (n: number) => `${n} variable${n === 1 ? '' : 's'}`;
    if (added.length) {
      parts.push(
        added.length <= MAX_NAMED
          ? `new: ${added.join(', ')}`
          : `${added.length} new variables`
      );
    }
    if (gone.length) {
      parts.push(
        gone.length <= MAX_NAMED
          ? `gone: ${gone.join(', ')}`
          : `${plural(gone.length)} gone`
      );
    }
    if (parts.length && !added.length && !gone.length) {
      parts.push('same variables');
    }
    return parts.length
      ? parts.join('; ')
      : 'same size and variables as the one before';
  }
  const count = (image.variables_count ?? 0) - (previous.variables_count ?? 0);
  if (count !== 0) {
    const n = Math.abs(count);
    parts.push(
      `${n} variable${n === 1 ? '' : 's'} ${count > 0 ? 'more' : 'fewer'}`
    );
  }
  return parts.length
    ? `${parts.join(', ')} than the one before`
    : 'same size and variables as the one before';
}

/** The image saved before `imageId` in the same entry (notebook or console kernel),
 * or undefined for the entry's first image. */
export function previousInEntry(
  rows: ISessionRow[],
  imageId: string
): ISessionRow | undefined {
  const time = (row: ISessionRow) => Date.parse(row.image.created ?? '') || 0;
  for (const { latest, older } of groupRows(rows)) {
    const images = [latest, ...older].sort((a, b) => time(b) - time(a));
    const at = images.findIndex(row => row.image.id === imageId);
    if (at >= 0) {
      return images[at + 1];
    }
  }
  return undefined;
}

/** What changed from one image's variables to the next one's, by name. */
export interface IVariableDiff {
  added: string[];
  removed: string[];
  /** Variables of both whose type, size, shape, device or status differ. */
  changed: string[];
}

/** The facts of a variable a manifest records, to tell that it changed. */
function facts(variable: IVariable): string {
  const { type, bytes, shape, dtype, devices, status } = variable;
  return JSON.stringify([type, bytes, shape, dtype, devices, status]);
}

/** The variables added, removed and changed from `before` (the image saved before) to
 * `now`, each list sorted. From manifests: a value rewritten with the same type and
 * size is not seen as changed. */
export function variableDiff(
  now: IVariable[],
  before: IVariable[]
): IVariableDiff {
  const old = new Map(before.map(v => [v.name, v]));
  const current = new Set(now.map(v => v.name));
  const sorted = (names: string[]) => [...names].sort();
  return {
    added: sorted(now.filter(v => !old.has(v.name)).map(v => v.name)),
    removed: sorted(before.filter(v => !current.has(v.name)).map(v => v.name)),
    changed: sorted(
      now
        .filter(v => old.has(v.name) && facts(old.get(v.name)!) !== facts(v))
        .map(v => v.name)
    )
  };
}

/** The state an entry shows: its notebook's (or console's) kernel, if one runs or is
 * suspended, else "saved" (only images). */
export type EntryState = 'running' | 'suspended' | 'saved';

/**
 * What the entry headed by `row` is now, and its kernel: the suspended kernel that
 * needs its image; else the kernel of its notebook's live session (`kernelPaths`:
 * kernel id -> notebook), or for a console the kernel that wrote it while the server
 * still knows it (`kernelState`); else no kernel.
 */
export function entryState(
  row: ISessionRow,
  kernelPaths: ReadonlyMap<string, string>,
  kernelState: (kernelId: string) => string | undefined
): { state: EntryState; kernel: string | null } {
  if (row.suspendedKernel) {
    return { state: 'suspended', kernel: row.suspendedKernel };
  }
  const own = row.image.kernel_id;
  if (row.notebookGone) {
    return { state: 'saved', kernel: null }; // a file of its old name is another one
  }
  const kernel = row.notebook
    ? [...kernelPaths].find(([, path]) => path === row.notebook)?.[0]
    : own && kernelState(own)
      ? own
      : undefined;
  if (!kernel) {
    return { state: 'saved', kernel: null };
  }
  return {
    state: kernelState(kernel) === 'suspended' ? 'suspended' : 'running',
    kernel
  };
}
