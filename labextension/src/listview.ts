/** How the panel shows its list: the order of its entries and the images selected. */

import { ISignal, Signal } from '@lumino/signaling';

import {
  deleteBlocked,
  ISessionEntry,
  ISessionRow,
  rowActions
} from './sessions';

/** The commands on the list's images (see listcommands.ts). */
export namespace ListCommandIDs {
  export const open = 'jupyter-ckpt:open-image';
  export const details = 'jupyter-ckpt:image-details';
  export const copyId = 'jupyter-ckpt:copy-image-id';
  export const showNotebook = 'jupyter-ckpt:show-image-notebook';
  export const remove = 'jupyter-ckpt:delete-image';
  export const removeOlder = 'jupyter-ckpt:delete-older-images';
  export const removeBefore = 'jupyter-ckpt:delete-images-before';
  export const selectAll = 'jupyter-ckpt:select-all-images';
  export const clearSelection = 'jupyter-ckpt:clear-image-selection';
}

/** What the entries are sorted by: their newest image's date (newest first), their
 * title (A to Z), or the size of all their images (largest first). */
export type SortKey = 'date' | 'name' | 'size';

export const SORT_KEYS: readonly SortKey[] = ['date', 'name', 'size'];

export function isSortKey(value: unknown): value is SortKey {
  return SORT_KEYS.includes(value as SortKey);
}

/** The size of an image's variables, as its row shows it. */
export function imageBytes(row: ISessionRow): number {
  return row.image.size?.logical ?? 0;
}

/** Every image of an entry, its head first. */
export function entryRows(entry: ISessionEntry): ISessionRow[] {
  return [entry.latest, ...entry.older];
}

const collator = new Intl.Collator(undefined, {
  numeric: true,
  sensitivity: 'base'
});

/** The entries in the order `key` asks for; ties keep their given order (newest
 * first, as `groupRows` makes them), which `date` keeps as it is. */
export function sortEntries(
  entries: readonly ISessionEntry[],
  key: SortKey
): ISessionEntry[] {
  const sorted = [...entries];
  if (key === 'name') {
    sorted.sort((a, b) => collator.compare(a.latest.title, b.latest.title));
  } else if (key === 'size') {
    const size = (entry: ISessionEntry) =>
      entryRows(entry).reduce((sum, row) => sum + imageBytes(row), 0);
    sorted.sort((a, b) => size(b) - size(a));
  }
  return sorted;
}

/** How a click changes the selection: alone (a plain click), `toggle` (Ctrl or Cmd),
 * `extend` (Shift: from the anchor to the row clicked). */
export interface IClickMode {
  toggle?: boolean;
  extend?: boolean;
}

/**
 * The images selected in the list, as in a file browser.
 *
 * Invariant: the anchor (where a Shift+click range starts) is the image last clicked
 * alone or with Ctrl/Cmd, or null; the selection holds only images the list has
 * (`retain` drops those gone).
 *
 * | event                 | selection                                  | anchor     |
 * | --------------------- | ------------------------------------------ | ---------- |
 * | click                 | that image alone                           | that image |
 * | Ctrl/Cmd+click        | that image added, or removed if it was in  | that image |
 * | Shift+click           | the rows from the anchor to it             | unchanged  |
 * | Ctrl+Shift+click      | those rows added to the selection          | unchanged  |
 * | select all            | every image given                          | unchanged  |
 * | clear                 | none                                       | null       |
 * | images gone (retain)  | without them                               | null if gone |
 */
export class Selection {
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get ids(): ReadonlySet<string> {
    return this._ids;
  }

  get size(): number {
    return this._ids.size;
  }

  has(id: string): boolean {
    return this._ids.has(id);
  }

  /** A click on image `id`; `order` is the rows as the list shows them, for a range. */
  click(id: string, mode: IClickMode, order: readonly string[]): void {
    const anchor = this._anchor;
    if (mode.extend && anchor !== null && order.includes(anchor)) {
      const [from, to] = [order.indexOf(anchor), order.indexOf(id)].sort(
        (a, b) => a - b
      );
      const range = order.slice(from, to + 1);
      this._set(mode.toggle ? [...this._ids, ...range] : range);
      return;
    }
    this._anchor = id;
    if (mode.toggle) {
      const next = new Set(this._ids);
      if (!next.delete(id)) {
        next.add(id);
      }
      this._set(next);
    } else {
      this._set([id]);
    }
  }

  selectAll(ids: Iterable<string>): void {
    this._set(ids);
  }

  clear(): void {
    this._anchor = null;
    this._set([]);
  }

  /** Keep only the images the list still has. */
  retain(present: ReadonlySet<string>): void {
    if (this._anchor !== null && !present.has(this._anchor)) {
      this._anchor = null;
    }
    this._set([...this._ids].filter(id => present.has(id)));
  }

  private _set(ids: Iterable<string>): void {
    const next = new Set(ids);
    const same =
      next.size === this._ids.size && [...next].every(id => this._ids.has(id));
    if (!same) {
      this._ids = next;
      this._changed.emit();
    }
  }

  private _ids = new Set<string>();
  private _anchor: string | null = null;
  private _changed = new Signal<this, void>(this);
}

/** The list's order and selection; `changed` when either changes. */
export class ListView {
  constructor() {
    this.selection.changed.connect(() => this._changed.emit());
  }

  readonly selection = new Selection();

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get sortBy(): SortKey {
    return this._sortBy;
  }

  set sortBy(key: SortKey) {
    if (key !== this._sortBy) {
      this._sortBy = key;
      this._changed.emit();
    }
  }

  private _sortBy: SortKey = 'date';
  private _changed = new Signal<this, void>(this);
}

/** Why a row's image cannot be deleted now, as its Delete button says; null if it can. */
export function whyNotDeletable(row: ISessionRow): string | null {
  return rowActions(row.image).includes('delete')
    ? deleteBlocked(row.image)
    : 'It cannot be verified.';
}

/** The images to delete among `rows` and the rest, which a kernel needs (`blocked`
 * says why, as for a single Delete) or which cannot be deleted at all. */
export function deletable(
  rows: readonly ISessionRow[],
  blocked: (row: ISessionRow) => string | null
): { remove: ISessionRow[]; keep: ISessionRow[] } {
  const remove: ISessionRow[] = [];
  const keep: ISessionRow[] = [];
  for (const row of rows) {
    (blocked(row) === null ? remove : keep).push(row);
  }
  return { remove, keep };
}

/** The images of `rows` saved before `date` (local midnight of a `YYYY-MM-DD` date
 * input's value); null when the value is no date. */
export function savedBefore(
  rows: readonly ISessionRow[],
  value: string
): ISessionRow[] | null {
  const match = /^(\d{4})-(\d{2})-(\d{2})$/.exec(value);
  if (!match) {
    return null;
  }
  const limit = new Date(+match[1], +match[2] - 1, +match[3]).getTime();
  return rows.filter(row => {
    const created = Date.parse(row.image.created ?? '');
    return !isNaN(created) && created < limit;
  });
}
