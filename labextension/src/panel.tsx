/** The Saved sessions sidebar: suspended kernels and saved images, with their actions. */

import { TranslationBundle } from '@jupyterlab/translation';
import {
  caretDownIcon,
  MenuSvg,
  ReactWidget,
  refreshIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import * as React from 'react';

import {
  exactTime,
  formatBytes,
  relativeTime,
  shortId,
  shortReason
} from './format';
import { LeftOutLine } from './exclusions';
import { loadFailure } from './loadfailure';
import { StoreMeter } from './storemeter';
import { ckptIcon, nameTagIcon } from './icon';
import {
  Compatibility,
  gpuNeed,
  InUseLine,
  ProgressLine,
  RecoveredBadge,
  TriggerFact
} from './badges';
import { KernelStatusModel, waitingText } from './kernelstatus';
import { imageBytes, ListCommandIDs, ListView, sortEntries } from './listview';
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
import { SelectionBar, sortLabels, SortSelect } from './selectionbar';

export interface IRowActions {
  resume(row: ISessionRow, target?: ResumeTarget): Promise<void>;
  remove(row: ISessionRow): Promise<void>;
  details(row: ISessionRow): Promise<void>;
  /** Have the kernel save variables it leaves out again; whether it worked. */
  include(kernelId: string, names: string[]): Promise<boolean>;
}

/** The entries of the list (its direct rows), in order. */
const ENTRY = '.jp-CkptPanel-list > .jp-CkptRow';

/** How a row is shown: an entry's head (`older`: its other images, folded) or one of
 * them; `previous`, the image before it, to say what changed since; `tabbable`, whether
 * its entry holds the list's one tab stop, and its buttons are in the tab order. */
interface IRowOptions {
  older?: ISessionRow[];
  previous?: ISessionRow;
  head?: boolean;
  tabbable?: boolean;
}

export class SavedSessionsPanel extends ReactWidget {
  constructor(
    readonly model: SavedSessionsModel,
    private readonly _kernels: KernelStatusModel,
    private readonly _actions: IRowActions,
    private readonly _commands: ConstructorParameters<
      typeof MenuSvg
    >[0]['commands'],
    private readonly _trans: TranslationBundle
  ) {
    super();
    this._resumeMenu = new MenuSvg({ commands: _commands });
    this._resumeMenu.addClass('jp-CkptResumeMenu');
    // Esc, or a click elsewhere, closes the menu: the keyboard goes back to its button
    // rather than to the page's body
    this._resumeMenu.aboutToClose.connect(this._onMenuClosed, this);
    this.id = 'jupyter-ckpt-sessions';
    this.title.icon = ckptIcon;
    this.title.caption = _trans.__('Saved Sessions');
    this.addClass('jp-CkptPanel');
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', _trans.__('Saved sessions'));
    this.node.tabIndex = -1;
    model.changed.connect(this._onModelChanged, this);
    _kernels.changed.connect(this.update, this);
    this.view.changed.connect(this.update, this);
  }

  /** The list's sort order and the images selected in it. */
  readonly view = new ListView();

  /** The row whose image the Resume menu, or the row's context menu, is about. */
  rowOf(imageId: string): ISessionRow | undefined {
    return this.model.allRows.find(row => row.image.id === imageId);
  }

  dispose(): void {
    this._resumeMenu.dispose();
    super.dispose();
  }

  /** Shown by a command or its tab: the keyboard goes with it, to the entry that holds
   * the list's tab stop, else the filter. */
  protected onActivateRequest(msg: Message): void {
    super.onActivateRequest(msg);
    requestAnimationFrame(() => {
      if (this.node.contains(document.activeElement)) {
        return;
      }
      const target =
        this.node.querySelector<HTMLElement>(`${ENTRY}[tabindex="0"]`) ??
        this.node.querySelector<HTMLElement>('.jp-CkptPanel-search');
      (target ?? this.node).focus();
    });
  }

  /** The Resume button's menu, below it: its notebook, a new notebook, a console. */
  private _openResumeMenu(row: ISessionRow, button: HTMLElement): void {
    const menu = this._resumeMenu;
    menu.clearItems();
    for (const command of Object.values(RESUME_COMMANDS)) {
      menu.addItem({ command, args: { imageId: row.image.id } });
    }
    const box = button.getBoundingClientRect();
    this._menuButton = button;
    menu.open(box.left, box.bottom);
  }

  private _onMenuClosed(): void {
    const button = this._menuButton;
    this._menuButton = null;
    // after the menu's own focus handling: a command it ran may have moved focus on
    requestAnimationFrame(() => {
      const active = document.activeElement;
      if (button?.isConnected && (!active || active === document.body)) {
        button.focus();
      }
    });
  }

  /** Up and Down move between the entries (Home and End: the first and the last);
   * Left and Right between the controls of the entry in focus. The list is one tab
   * stop, on the entry last in focus (a roving tabindex). */
  private _onListKey(event: React.KeyboardEvent<HTMLUListElement>): void {
    const target = event.target as HTMLElement;
    const entry = target.closest<HTMLElement>(ENTRY);
    if (!entry || target.closest('input, select, textarea')) {
      return;
    }
    const entries = Array.from(
      event.currentTarget.querySelectorAll<HTMLElement>(':scope > .jp-CkptRow')
    );
    const index = entries.indexOf(entry);
    const focusEntry = (i: number) => {
      const next = entries[Math.max(0, Math.min(entries.length - 1, i))];
      event.preventDefault();
      this._focusKey = next.dataset.imageId ?? null;
      this.update();
      next.focus();
    };
    if (event.key === 'ArrowDown') {
      focusEntry(index + 1);
    } else if (event.key === 'ArrowUp') {
      focusEntry(index - 1);
    } else if (event.key === 'Home') {
      focusEntry(0);
    } else if (event.key === 'End') {
      focusEntry(entries.length - 1);
    } else if (event.key === 'ArrowRight' || event.key === 'ArrowLeft') {
      const controls = Array.from(
        entry.querySelectorAll<HTMLElement>('button, summary')
      ).filter(control => control.getClientRects().length > 0);
      const at = controls.indexOf(target);
      const step = event.key === 'ArrowRight' ? 1 : -1;
      const next =
        at < 0
          ? controls[step > 0 ? 0 : controls.length - 1]
          : controls[at + step];
      event.preventDefault();
      (next ?? entry).focus();
    }
  }

  /** Focus moved into an entry: it holds the list's tab stop from now on. */
  private _onListFocus(event: React.FocusEvent<HTMLUListElement>): void {
    const entry = (event.target as HTMLElement).closest<HTMLElement>(ENTRY);
    const key = entry?.dataset.imageId ?? null;
    if (key && key !== this._focusKey) {
      this._focusKey = key;
      this.update();
    }
  }

  private _onModelChanged(): void {
    // set at once, not at the next render: assistive technology (and tests) can tell
    // whether the list shown is being reloaded
    this.node.setAttribute('aria-busy', String(this.model.busy));
    this.view.selection.retain(
      new Set(this.model.allRows.map(row => row.image.id))
    );
    this.update();
  }

  /** A click on a row, not on its controls, selects it (Ctrl/Cmd: adds or removes it;
   * Shift: the rows from the last one clicked), as in the File Browser. */
  private _onListClick(event: React.MouseEvent<HTMLUListElement>): void {
    const target = event.target as HTMLElement;
    const id = target.closest<HTMLElement>('[data-image-id]')?.dataset.imageId;
    if (!id || target.closest('button, summary, a, input, select')) {
      return;
    }
    // the rows as shown, folded ones left out: the range a Shift+click spans
    const order = Array.from(
      event.currentTarget.querySelectorAll<HTMLElement>('[data-image-id]')
    )
      .filter(row => row.getClientRects().length > 0)
      .map(row => row.dataset.imageId!);
    this.view.selection.click(
      id,
      { toggle: event.ctrlKey || event.metaKey, extend: event.shiftKey },
      order
    );
  }

  /** The context menu acts on the selection when it is opened on a selected row,
   * else on that row alone, which it selects. */
  private _onListContextMenu(event: React.MouseEvent<HTMLUListElement>): void {
    const id = (event.target as HTMLElement).closest<HTMLElement>(
      '[data-image-id]'
    )?.dataset.imageId;
    if (id && !this.view.selection.has(id)) {
      this.view.selection.click(id, {}, []);
    }
  }

  protected onAfterShow(): void {
    // the list may have changed while hidden (a %ckpt save writes no server event)
    void this.model.refresh();
  }

  render(): JSX.Element {
    const model = this.model;
    const trans = this._trans;
    const entries = sortEntries(model.entries, this.view.sortBy);
    const keys = entries.map(entry => entry.latest.image.id);
    // entries of one title (two consoles of one name, a notebook deleted and another
    // made under its name): their heads' buttons name the image too
    const titles = entries.map(entry => entry.latest.title);
    this._repeatedTitles = new Set(
      titles.filter((title, i) => titles.indexOf(title) !== i)
    );
    // the entry that holds the list's tab stop: the one last in focus, else the first
    const focusKey =
      this._focusKey && keys.includes(this._focusKey)
        ? this._focusKey
        : (keys[0] ?? null);
    return (
      <>
        <div className="jp-CkptPanel-top">
          <div className="jp-CkptPanel-header">
            <h2 className="jp-CkptPanel-heading">
              {trans.__('Saved sessions')}
            </h2>
            <div
              className="jp-Toolbar jp-CkptPanel-toolbar"
              role="toolbar"
              aria-label={trans.__('Saved sessions')}
            >
              <ToolbarButtonComponent
                icon={refreshIcon}
                onClick={() => void model.refresh()}
                tooltip={trans.__('Refresh saved sessions')}
              />
            </div>
          </div>
          <div className="jp-CkptPanel-filter">
            <input
              className="jp-CkptPanel-search jp-mod-styled"
              type="search"
              placeholder={trans.__(
                'Filter: name, var:x, label:y, trigger:idle'
              )}
              aria-label={trans.__('Filter saved sessions')}
              title={trans.__(
                'Words that must all match: plain text matches the notebook, the image name, a variable name or what wrote the image; var:, label:, trigger: and notebook: match only that'
              )}
              value={model.query}
              onChange={event => (model.query = event.target.value)}
            />
            <SortSelect view={this.view} trans={trans} />
          </div>
          {this._renderSelection()}
          <StoreMeter store={this._kernels.store} trans={trans} />
        </div>
        {this._renderStoreProblem()}
        {this._renderState()}
        {entries.length > 0 && (
          <ul
            className="jp-CkptPanel-list"
            aria-label={trans.__(
              'Saved sessions, %1',
              sortLabels(trans)[this.view.sortBy].toLowerCase()
            )}
            onKeyDown={event => this._onListKey(event)}
            onFocus={event => this._onListFocus(event)}
            onClick={event => this._onListClick(event)}
            onContextMenu={event => this._onListContextMenu(event)}
            onMouseDown={event => event.shiftKey && event.preventDefault()}
          >
            {entries.map(entry =>
              this._renderRow(entry.latest, {
                older: entry.older,
                previous: entry.older[0],
                head: true,
                tabbable: entry.latest.image.id === focusKey
              })
            )}
          </ul>
        )}
      </>
    );
  }

  /** How many images are selected, and Delete and Clear for them. */
  private _renderSelection(): JSX.Element {
    const selection = this.view.selection;
    const rows = this.model.allRows.filter(row => selection.has(row.image.id));
    const args = { imageId: rows[0]?.image.id ?? '' };
    const remove = ListCommandIDs.remove;
    const commands = this._commands;
    return (
      <SelectionBar
        count={rows.length}
        bytes={rows.reduce((sum, row) => sum + imageBytes(row), 0)}
        deleteBlocked={
          rows.length && !commands.isEnabled(remove, args)
            ? commands.caption(remove, args)
            : null
        }
        onDelete={() => void commands.execute(remove, args)}
        onClear={() => selection.clear()}
        trans={this._trans}
      />
    );
  }

  /** While the server cannot use its store: that nothing is saved, suspended or
   * deleted meanwhile, and why. */
  private _renderStoreProblem(): JSX.Element | null {
    const problem = this._kernels.storeProblem;
    if (!problem) {
      return null;
    }
    const trans = this._trans;
    return (
      <div
        className="jp-CkptPanel-message jp-mod-error jp-CkptPanel-store"
        role="alert"
      >
        <p>
          {trans.__(
            'The store cannot be written now: kernels are not saved or suspended, and images cannot be deleted. This clears once a save succeeds.'
          )}
        </p>
        <p>{shortReason(problem)}.</p>
        <details className="jp-CkptPanel-details">
          <summary>{trans.__('Show details')}</summary>
          <p className="jp-CkptPanel-storeError">{problem}</p>
        </details>
      </div>
    );
  }

  /** What to do when there is nothing (yet) to show. */
  private _renderState(): JSX.Element | null {
    const model = this.model;
    const trans = this._trans;
    if (model.state === 'error') {
      const { lead, details } = loadFailure(model.failure, trans);
      return (
        <div className="jp-CkptPanel-message jp-mod-error" role="alert">
          <p>{lead}</p>
          {model.allRows.length > 0 && (
            <p>
              {trans.__(
                'The list below is as it was last loaded; its buttons wait until it loads again.'
              )}
            </p>
          )}
          <details className="jp-CkptPanel-details">
            <summary>{trans.__('Show details')}</summary>
            <p className="jp-CkptPanel-storeError">{details}</p>
          </details>
          <button
            className="jp-CkptButton"
            onClick={() => void model.refresh()}
          >
            {trans.__('Try again')}
          </button>
        </div>
      );
    }
    if (model.state === 'loading') {
      return (
        <p className="jp-CkptPanel-message" role="status">
          {trans.__('Loading saved sessions…')}
        </p>
      );
    }
    if (model.allRows.length === 0) {
      return (
        <div className="jp-CkptPanel-message" role="status">
          <p>{trans.__('No saved sessions yet.')}</p>
          <p>
            {trans.__(
              'Idle kernels are saved here automatically. To save one now, use Kernel › Save Kernel State Now.'
            )}
          </p>
        </div>
      );
    }
    if (model.rows.length === 0) {
      // entries, as the list shows them: not the images folded inside them
      return (
        <p className="jp-CkptPanel-message" role="status">
          {trans._n(
            'No saved session matches “%2”. Clear the filter to see the one there is.',
            'No saved session matches “%2”. Clear the filter to see all %1.',
            model.entryCount,
            model.query
          )}
        </p>
      );
    }
    return null;
  }

  private _renderRow(
    row: ISessionRow,
    { older = [], previous, head = false, tabbable = false }: IRowOptions = {}
  ): JSX.Element {
    const trans = this._trans;
    const { image } = row;
    const now = Date.now();
    const note = this.model.noteFor(image.id);
    const titleId = `jp-CkptRow-title-${image.id}`;
    const entryProps = head ? { tabIndex: tabbable ? 0 : -1 } : {};
    if (image.state === 'invalid') {
      return (
        <li
          key={image.id}
          className={`jp-CkptRow jp-mod-invalid${this._selectedClass(image.id)}`}
          data-image-id={image.id}
          aria-labelledby={titleId}
          {...entryProps}
        >
          <div className="jp-CkptRow-title" id={titleId} title={image.id}>
            {shortId(image.id)}
          </div>
          <p className="jp-CkptRow-problem">
            {trans.__(
              'Cannot be verified, so it cannot be resumed or deleted here: %1.',
              shortReason(image.error ?? '')
            )}
          </p>
          <details className="jp-CkptPanel-details">
            <summary>{trans.__('Show details')}</summary>
            <p className="jp-CkptPanel-storeError">{image.error}</p>
          </details>
          {note && (
            <p className="jp-CkptRow-note" role="alert">
              {note}
            </p>
          )}
          {this._renderActions(row, image.id, tabbable)}
        </li>
      );
    }
    const facts: React.ReactNode[] = [];
    if (image.created) {
      facts.push(
        <span key="when">
          {trans.__('saved')}{' '}
          <time dateTime={image.created} title={exactTime(image.created)}>
            {relativeTime(image.created, now)}
          </time>
        </span>
      );
    }
    if (image.trigger) {
      facts.push(
        <TriggerFact key="trigger" trigger={image.trigger} trans={trans} />
      );
    }
    if (image.size?.logical !== undefined) {
      facts.push(<span key="size">{formatBytes(image.size.logical)}</span>);
    }
    if (image.variables_count !== undefined) {
      facts.push(
        <span key="vars">
          {trans._n('%1 variable', '%1 variables', image.variables_count)}
        </span>
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
          title={trans.__('What changed since the image before it')}
        >
          {changeSince(image, previous.image)}
        </span>
      );
    }
    const label = row.title;
    // an older image's buttons name the image: the entry's head has the same title
    const actionsLabel =
      head && !this._repeatedTitles.has(label)
        ? label
        : trans.__('%1, image %2', label, imageLabel(image));
    return (
      <li
        key={image.id}
        className={`jp-CkptRow${this._selectedClass(image.id)}`}
        data-image-id={image.id}
        aria-labelledby={titleId}
        aria-busy={this.model.isActing(image.id) ? 'true' : undefined}
        {...entryProps}
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
                  title={trans.__(
                    'Kernel %1 is suspended to this image',
                    row.suspendedKernel
                  )}
                >
                  {trans.__('Suspended kernel')}
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
            title={trans.__('Saved under the name %1', image.name ?? '')}
          >
            <nameTagIcon.react tag="span" className="jp-CkptRow-nameIcon" />
            {image.name}
          </div>
        )}
        <InUseLine names={row.inUse} trans={trans} />
        <div className="jp-CkptRow-facts">{facts}</div>
        {row.suspendedKernel && (
          <ProgressLine
            progress={this._kernels.progress(row.suspendedKernel)}
          />
        )}
        <Compatibility compat={image.compatibility} id={image.id} />
        {image.lost && image.lost.length > 0 && (
          <p className="jp-CkptRow-problem">
            <span className="jp-CkptRow-problemLabel">
              {trans.__('Not saved:')}
            </span>{' '}
            {image.lost.join(', ')}
          </p>
        )}
        <LeftOutLine
          names={image.excluded}
          label={actionsLabel}
          onInclude={this._includer(head, image)}
          tabIndex={tabbable ? 0 : -1}
          trans={trans}
        />
        {note && (
          <p className="jp-CkptRow-note" role="alert">
            {note}
          </p>
        )}
        {this._renderActions(row, actionsLabel, tabbable)}
        {older.length > 0 && (
          <details className="jp-CkptRow-older">
            <summary tabIndex={tabbable ? 0 : -1}>
              {trans._n('%1 older image', '%1 older images', older.length)}
            </summary>
            <ul className="jp-CkptPanel-list">
              {older.map((other, i) =>
                this._renderRow(other, { previous: older[i + 1], tabbable })
              )}
            </ul>
          </details>
        )}
      </li>
    );
  }

  private _selectedClass(imageId: string): string {
    return this.view.selection.has(imageId) ? ' jp-mod-selected' : '';
  }

  /** The way back for an entry's head whose kernel runs and leaves variables out. */
  private _includer(
    head: boolean,
    image: ISessionRow['image']
  ): (() => Promise<boolean>) | null {
    const { kernel_id: kernel, excluded } = image;
    return head &&
      kernel &&
      this.model.state !== 'error' &&
      excluded?.length &&
      this._kernels.kernel(kernel)?.state === 'running'
      ? () => this._actions.include(kernel, excluded)
      : null;
  }

  /** What an entry is now: its kernel suspended, running, or only images saved. */
  private _renderEntryState(row: ISessionRow): JSX.Element {
    const trans = this._trans;
    const { state, kernel } = entryState(
      row,
      this.model.kernelPaths,
      id => this._kernels.kernel(id)?.state
    );
    const demand = kernel ? this._kernels.kernel(kernel)?.gpu_demand : null;
    if (demand) {
      return (
        <span
          className="jp-CkptBadge jp-mod-waiting"
          title={waitingText(demand, 0).title}
        >
          {trans.__('Waiting for a GPU: %1 ahead of you', demand.ahead)}
        </span>
      );
    }
    if (state === 'suspended') {
      return (
        <span
          className="jp-CkptBadge jp-mod-suspended"
          title={
            row.suspendedKernel
              ? trans.__('Kernel %1 is suspended to this image', kernel ?? '')
              : trans.__('Kernel %1 is suspended to an image', kernel ?? '')
          }
        >
          {trans.__('Suspended kernel')}
        </span>
      );
    }
    if (state === 'running') {
      return (
        <span
          className="jp-CkptBadge jp-mod-running"
          title={trans.__(
            'Kernel %1 is running; these are its saved images',
            kernel ?? ''
          )}
        >
          {trans.__('Running')}
        </span>
      );
    }
    return (
      <span
        className="jp-CkptBadge jp-mod-saved"
        title={trans.__(
          'No kernel runs for it: Resume starts one from the image'
        )}
      >
        {trans.__('Saved')}
      </span>
    );
  }

  /** The row's buttons (see `rowActions`); none for an image that fails verification.
   * Disabled while an action runs on the row, which a second click would run twice;
   * in the tab order only while the row's entry holds the list's tab stop. */
  private _renderActions(
    row: ISessionRow,
    label: string,
    tabbable: boolean
  ): JSX.Element | null {
    const trans = this._trans;
    const actions = rowActions(row.image);
    if (actions.length === 0) {
      return null;
    }
    // a list that cannot be reloaded may be stale: nothing acts on what it shows
    const busy =
      this.model.isActing(row.image.id) || this.model.state === 'error';
    const tabIndex = tabbable ? 0 : -1;
    const open = !!row.suspendedKernel;
    const buttons: Record<RowAction, JSX.Element> = {
      resume: (
        <span key="resume" className="jp-CkptRow-resume">
          <button
            className="jp-CkptButton jp-mod-accept"
            onClick={() => void this._actions.resume(row)}
            disabled={busy}
            tabIndex={tabIndex}
            aria-label={
              open ? trans.__('Open %1', label) : trans.__('Resume %1', label)
            }
            title={
              open
                ? trans.__(
                    'Open the notebook; running a cell restores its kernel'
                  )
                : trans.__(
                    'Start a kernel restored from this image and open its notebook'
                  )
            }
          >
            {open ? trans.__('Open') : trans.__('Resume')}
          </button>
          <button
            className="jp-CkptButton jp-mod-accept jp-CkptRow-resumeMenu"
            onClick={event => this._openResumeMenu(row, event.currentTarget)}
            disabled={busy}
            tabIndex={tabIndex}
            aria-haspopup="menu"
            aria-label={trans.__('Resume options for %1', label)}
            title={trans.__(
              'Resume in its notebook, in a new notebook or in a console'
            )}
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
          disabled={busy}
          tabIndex={tabIndex}
          aria-label={trans.__('Details of %1', label)}
        >
          {trans.__('Details')}
        </button>
      ),
      delete: this._renderDelete(row, label, busy, tabIndex)
    };
    return (
      <div className="jp-CkptRow-actions">{actions.map(a => buttons[a])}</div>
    );
  }

  /** Delete, or why not: aria-disabled rather than disabled, so that the reason in
   * its tooltip shows on hover and reaches keyboard and screen reader users. */
  private _renderDelete(
    row: ISessionRow,
    label: string,
    busy: boolean,
    tabIndex: number
  ): JSX.Element {
    const trans = this._trans;
    const blocked =
      deleteBlocked(row.image) ??
      (this._kernels.storeProblem
        ? trans.__(
            'The store cannot be written now, so no image can be deleted: %1',
            this._kernels.storeProblem
          )
        : null);
    return (
      <button
        key="delete"
        className="jp-CkptButton jp-mod-warn"
        onClick={() => !blocked && void this._actions.remove(row)}
        disabled={busy}
        tabIndex={tabIndex}
        aria-label={trans.__('Delete %1', label)}
        aria-disabled={blocked ? 'true' : undefined}
        title={blocked ?? trans.__('Delete image %1', imageLabel(row.image))}
      >
        {trans.__('Delete')}
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
  private _menuButton: HTMLElement | null = null;
  private _repeatedTitles = new Set<string>();
  private _focusKey: string | null = null;
}
