/** The Saved sessions sidebar: suspended kernels and saved images, with their actions. */

import {
  caretDownIcon,
  MenuSvg,
  ReactWidget,
  refreshIcon,
  tagIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import * as React from 'react';

import { exactTime, formatBytes, relativeTime, shortId } from './format';
import { ckptIcon } from './icon';
import { Compatibility, gpuNeed, ProgressLine, RecoveredBadge } from './badges';
import { KernelStatusModel } from './kernelstatus';
import { RESUME_COMMANDS, ResumeTarget } from './resume';
import {
  changeSince,
  deleteBlocked,
  entryState,
  imageLabel,
  isNamed,
  ISessionRow,
  RowAction,
  rowActions,
  SavedSessionsModel
} from './sessions';

export interface IRowActions {
  resume(row: ISessionRow, target?: ResumeTarget): Promise<void>;
  remove(row: ISessionRow): Promise<void>;
  details(row: ISessionRow): Promise<void>;
}

export class SavedSessionsPanel extends ReactWidget {
  constructor(
    readonly model: SavedSessionsModel,
    private readonly _kernels: KernelStatusModel,
    private readonly _actions: IRowActions,
    commands: ConstructorParameters<typeof MenuSvg>[0]['commands']
  ) {
    super();
    this._resumeMenu = new MenuSvg({ commands });
    this._resumeMenu.addClass('jp-CkptResumeMenu');
    this.id = 'jupyter-ckpt-sessions';
    this.title.icon = ckptIcon;
    this.title.caption = 'Saved sessions';
    this.addClass('jp-CkptPanel');
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'Saved sessions');
    model.changed.connect(this._onModelChanged, this);
    _kernels.changed.connect(this.update, this);
  }

  /** The row whose image the Resume menu, or the row's context menu, is about. */
  rowOf(imageId: string): ISessionRow | undefined {
    return this.model.allRows.find(row => row.image.id === imageId);
  }

  dispose(): void {
    this._resumeMenu.dispose();
    super.dispose();
  }

  /** The Resume button's menu, below it: its notebook, a new notebook, a console. */
  private _openResumeMenu(row: ISessionRow, button: HTMLElement): void {
    const menu = this._resumeMenu;
    menu.clearItems();
    for (const command of Object.values(RESUME_COMMANDS)) {
      menu.addItem({ command, args: { imageId: row.image.id } });
    }
    const box = button.getBoundingClientRect();
    menu.open(box.left, box.bottom);
  }

  private _onModelChanged(): void {
    // set at once, not at the next render: assistive technology (and tests) can tell
    // whether the list shown is being reloaded
    this.node.setAttribute('aria-busy', String(this.model.busy));
    this.update();
  }

  protected onAfterShow(): void {
    // the list may have changed while hidden (a %ckpt save writes no server event)
    void this.model.refresh();
  }

  render(): JSX.Element {
    const model = this.model;
    return (
      <>
        <div className="jp-CkptPanel-header">
          <h2 className="jp-CkptPanel-heading">Saved sessions</h2>
          <div
            className="jp-Toolbar jp-CkptPanel-toolbar"
            role="toolbar"
            aria-label="Saved sessions"
          >
            <ToolbarButtonComponent
              icon={refreshIcon}
              onClick={() => void model.refresh()}
              tooltip="Refresh saved sessions"
            />
          </div>
        </div>
        <input
          className="jp-CkptPanel-search jp-mod-styled"
          type="search"
          placeholder="Filter by notebook name"
          aria-label="Filter saved sessions by notebook name"
          value={model.query}
          onChange={event => (model.query = event.target.value)}
        />
        {this._renderState()}
        {model.rows.length > 0 && (
          <ul
            className="jp-CkptPanel-list"
            aria-label="Saved sessions, newest first"
          >
            {model.entries.map(entry =>
              this._renderRow(entry.latest, entry.older, entry.older[0], true)
            )}
          </ul>
        )}
      </>
    );
  }

  /** What to do when there is nothing (yet) to show. */
  private _renderState(): JSX.Element | null {
    const model = this.model;
    if (model.state === 'error') {
      return (
        <div className="jp-CkptPanel-message jp-mod-error" role="alert">
          <p>Could not load saved sessions: {model.error}</p>
          <p>
            Check that the server extension is enabled (
            <code>jupyter server extension list</code> shows
            jupyter_ckpt_server), then try again.
          </p>
          <button
            className="jp-CkptButton"
            onClick={() => void model.refresh()}
          >
            Try again
          </button>
        </div>
      );
    }
    if (model.state === 'loading') {
      return (
        <p className="jp-CkptPanel-message" role="status">
          Loading saved sessions…
        </p>
      );
    }
    if (model.allRows.length === 0) {
      return (
        <div className="jp-CkptPanel-message" role="status">
          <p>No saved sessions yet.</p>
          <p>
            Idle kernels are saved here automatically. To save one now, use
            Kernel › Save Kernel State Now, or run <code>%ckpt save</code> in a
            notebook after <code>%load_ext jupyter_ckpt</code>.
          </p>
        </div>
      );
    }
    if (model.rows.length === 0) {
      return (
        <p className="jp-CkptPanel-message" role="status">
          No saved session matches “{model.query}”. Clear the filter to see all{' '}
          {model.allRows.length}.
        </p>
      );
    }
    return null;
  }

  /** A row; with `older`, the head of a notebook's entry, its other images folded;
   * `previous`, the entry's image before this one, to say what changed since. */
  private _renderRow(
    row: ISessionRow,
    older: ISessionRow[] = [],
    previous?: ISessionRow,
    head = false
  ): JSX.Element {
    const { image } = row;
    const now = Date.now();
    const note = this.model.noteFor(image.id);
    const titleId = `jp-CkptRow-title-${image.id}`;
    if (image.state === 'invalid') {
      return (
        <li
          key={image.id}
          className="jp-CkptRow jp-mod-invalid"
          data-image-id={image.id}
          aria-labelledby={titleId}
        >
          <div className="jp-CkptRow-title" id={titleId} title={image.id}>
            {shortId(image.id)}
          </div>
          <p className="jp-CkptRow-problem">
            Cannot be verified, so it cannot be resumed or deleted here:{' '}
            {image.error}
          </p>
          {note && (
            <p className="jp-CkptRow-note" role="alert">
              {note}
            </p>
          )}
          {this._renderActions(row, image.id)}
        </li>
      );
    }
    const facts: React.ReactNode[] = [];
    if (image.created) {
      facts.push(
        <span key="when">
          saved{' '}
          <time dateTime={image.created} title={exactTime(image.created)}>
            {relativeTime(image.created, now)}
          </time>
        </span>
      );
    }
    if (image.size?.logical !== undefined) {
      facts.push(<span key="size">{formatBytes(image.size.logical)}</span>);
    }
    if (image.variables_count !== undefined) {
      const n = image.variables_count;
      facts.push(
        <span key="vars">{`${n} variable${n === 1 ? '' : 's'}`}</span>
      );
    }
    const gpu = this._gpuText(row);
    if (gpu) {
      facts.push(<span key="gpu">{gpu}</span>);
    }
    if (previous) {
      facts.push(
        <span
          key="change"
          className="jp-CkptRow-change"
          title="What changed since the image before it"
        >
          {changeSince(image, previous.image)}
        </span>
      );
    }
    const label = row.title;
    return (
      <li
        key={image.id}
        className="jp-CkptRow"
        data-image-id={image.id}
        aria-labelledby={titleId}
      >
        <div
          className="jp-CkptRow-title"
          id={titleId}
          title={row.notebook ?? undefined}
        >
          {label}
          {head
            ? this._renderEntryState(row)
            : row.suspendedKernel && (
                <span
                  className="jp-CkptBadge jp-mod-suspended"
                  title={`Kernel ${row.suspendedKernel} is suspended to this image`}
                >
                  Suspended kernel
                </span>
              )}
          {row.suspendedKernel && (
            <RecoveredBadge
              status={this._kernels.kernel(row.suspendedKernel)}
            />
          )}
        </div>
        {isNamed(row) && (
          <div
            className="jp-CkptRow-name"
            title={`Saved under the name ${image.name}`}
          >
            <tagIcon.react tag="span" className="jp-CkptRow-nameIcon" />
            {image.name}
          </div>
        )}
        <div className="jp-CkptRow-facts">{facts}</div>
        {row.suspendedKernel && (
          <ProgressLine
            progress={this._kernels.progress(row.suspendedKernel)}
          />
        )}
        <Compatibility compat={image.compatibility} id={image.id} />
        {image.lost && image.lost.length > 0 && (
          <p className="jp-CkptRow-problem">
            Not saved: {image.lost.join(', ')}
          </p>
        )}
        {note && (
          <p className="jp-CkptRow-note" role="alert">
            {note}
          </p>
        )}
        {this._renderActions(row, label)}
        {older.length > 0 && (
          <details className="jp-CkptRow-older">
            <summary>
              {older.length} older image{older.length === 1 ? '' : 's'}
            </summary>
            <ul className="jp-CkptPanel-list">
              {older.map((other, i) =>
                this._renderRow(other, [], older[i + 1])
              )}
            </ul>
          </details>
        )}
      </li>
    );
  }

  /** What an entry is now: its kernel suspended, running, or only images saved. */
  private _renderEntryState(row: ISessionRow): JSX.Element {
    const { state, kernel } = entryState(
      row,
      this.model.kernelPaths,
      id => this._kernels.kernel(id)?.state
    );
    if (state === 'suspended') {
      return (
        <span
          className="jp-CkptBadge jp-mod-suspended"
          title={`Kernel ${kernel} is suspended to ${row.suspendedKernel ? 'this image' : 'an image'}`}
        >
          Suspended kernel
        </span>
      );
    }
    if (state === 'running') {
      return (
        <span
          className="jp-CkptBadge jp-mod-running"
          title={`Kernel ${kernel} is running; these are its saved images`}
        >
          Running
        </span>
      );
    }
    return (
      <span
        className="jp-CkptBadge jp-mod-saved"
        title="No kernel runs for it: Resume starts one from the image"
      >
        Saved
      </span>
    );
  }

  /** The row's buttons (see `rowActions`); none for an image that fails verification. */
  private _renderActions(row: ISessionRow, label: string): JSX.Element | null {
    const actions = rowActions(row.image);
    if (actions.length === 0) {
      return null;
    }
    const buttons: Record<RowAction, JSX.Element> = {
      resume: (
        <span key="resume" className="jp-CkptRow-resume">
          <button
            className="jp-CkptButton jp-mod-accept"
            onClick={() => void this._actions.resume(row)}
            aria-label={`${row.suspendedKernel ? 'Open' : 'Resume'} ${label}`}
            title={
              row.suspendedKernel
                ? 'Open the notebook; running a cell restores its kernel'
                : 'Start a kernel restored from this image and open its notebook'
            }
          >
            {row.suspendedKernel ? 'Open' : 'Resume'}
          </button>
          <button
            className="jp-CkptButton jp-mod-accept jp-CkptRow-resumeMenu"
            onClick={event => this._openResumeMenu(row, event.currentTarget)}
            aria-haspopup="menu"
            aria-label={`Resume options for ${label}`}
            title="Resume in its notebook, in a new notebook or in a console"
          >
            <caretDownIcon.react tag="span" elementPosition="center" />
          </button>
        </span>
      ),
      details: (
        <button
          key="details"
          className="jp-CkptButton"
          onClick={() => void this._actions.details(row)}
          aria-label={`Details of ${label}`}
        >
          Details
        </button>
      ),
      delete: this._renderDelete(row, label)
    };
    return (
      <div className="jp-CkptRow-actions">{actions.map(a => buttons[a])}</div>
    );
  }

  /** Delete, or why not: aria-disabled rather than disabled, so that the reason in
   * its tooltip shows on hover and reaches keyboard and screen reader users. */
  private _renderDelete(row: ISessionRow, label: string): JSX.Element {
    const blocked = deleteBlocked(row.image);
    return (
      <button
        key="delete"
        className="jp-CkptButton jp-mod-warn"
        onClick={() => !blocked && void this._actions.remove(row)}
        aria-label={`Delete ${label}`}
        aria-disabled={blocked ? 'true' : undefined}
        title={blocked ?? `Delete image ${imageLabel(row.image)}`}
      >
        Delete
      </button>
    );
  }

  /** The GPU the image needs: the model it was saved from, else the devices its tensors
   * were on; the memory its own record gives, else what its suspended kernel freed. */
  private _gpuText(row: ISessionRow): string | null {
    const { gpu, devices } = row.image;
    const memory =
      gpu?.memory_bytes ??
      (row.suspendedKernel
        ? this._kernels.kernel(row.suspendedKernel)?.gpu_bytes
        : undefined);
    const where = gpu?.model ?? devices?.filter(d => d !== 'cpu').join(', ');
    return gpuNeed(where || undefined, memory);
  }

  private readonly _resumeMenu: MenuSvg;
}
