/** What the panel's buttons and the commands do; failures become notifications. */

import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { TranslationBundle } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { showDetails } from './details';
import { includeCode, leftOutNotice } from './exclusions';
import { baseName, formatBytes, shortId, shortReason } from './format';
import {
  confirmSuspend,
  excludeCode,
  KernelStatusModel,
  nameList,
  unsaveableText
} from './kernelstatus';
import { IRowActions } from './panel';
import {
  AskReason,
  IResumed,
  IResumeHost,
  ITargetChoice,
  newNotebookDir,
  ResumeTarget,
  resumeInto
} from './resume';
import {
  imageLabel,
  ISessionRow,
  previousInEntry,
  refusalText,
  SavedSessionsModel
} from './sessions';
import { ICkptApi, IWriteReply } from './types';

function reason(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The choices a user makes once for all (the extension's settings). */
export interface ICkptSettings {
  /** Ask before deleting a saved image. */
  confirmDelete: boolean;
  /** Ask before a resume replaces a notebook's running kernel. */
  confirmReplace: boolean;
  /** Say so when a save, suspend, resume or delete went well (failures always show). */
  successNotifications: boolean;
}

export const DEFAULT_SETTINGS: ICkptSettings = {
  confirmDelete: true,
  confirmReplace: true,
  successNotifications: true
};

/** How long a notification of a success stays. */
const SUCCESS_MS = 5000;

export class CkptActions implements IRowActions {
  constructor(
    private readonly _app: JupyterFrontEnd,
    private readonly _docManager: IDocumentManager,
    private readonly _api: ICkptApi,
    private readonly _sessions: SavedSessionsModel,
    private readonly _kernels: KernelStatusModel,
    private readonly _trans: TranslationBundle,
    private readonly _settings: () => ICkptSettings = () => DEFAULT_SETTINGS
  ) {}

  /** Save now. Without a name: the server labels the image "manual" (a state the user
   * chose to keep), and writes none when nothing changed since the kernel's newest
   * image, which it names instead. */
  async checkpoint(kernelId: string): Promise<void> {
    await this._write('Checkpoint', kernelId, () =>
      this._api.checkpoint(kernelId)
    );
  }

  /** Suspend now; if the kernel still works in the background, only once the user has
   * confirmed that this work may be stopped. */
  async suspend(kernelId: string): Promise<void> {
    if (
      !(await confirmSuspend(this._api, kernelId, w => this._confirmStop(w)))
    ) {
      return;
    }
    await this._write('Suspend', kernelId, () => this._api.suspend(kernelId));
  }

  /** Resume the row's image into its notebook (the default: opened if closed; asked
   * where when the file is gone; a suspended kernel's row opens its notebook as it
   * is), a new notebook, or a console (see `resumeInto`). The server makes the restored
   * kernel a notebook's only one: the kernel it had, open or not, is shut down, after the
   * user agreed when it runs with state to lose. One action at a time per row: a
   * second click while it runs does nothing. */
  resume(row: ISessionRow, target: ResumeTarget = 'notebook'): Promise<void> {
    return this._sessions.act(row.image.id, async () => {
      this._sessions.clearNote(row.image.id);
      try {
        const resumed = await resumeInto(row, target, this._resumeHost);
        if (resumed) {
          this._reportResume(row, resumed);
        }
      } catch (error) {
        this.failure(
          this._trans.__('Could not resume %1', row.title),
          reason(error)
        );
      }
      void this._sessions.refresh();
    });
  }

  private readonly _resumeHost: IResumeHost = {
    exists: path => this._exists(path),
    isSuspended: async kernelId => {
      // whether it still exists, from the kernels list: asking the ckpt status route
      // would check every running kernel
      const kernels = this._app.serviceManager.kernels;
      await kernels.refreshRunning();
      const alive = [...kernels.running()].some(k => k.id === kernelId);
      return alive && this._kernels.isSuspended(kernelId);
    },
    confirmReplace: path => this._confirmReplace(path),
    askTarget: (row, why) => this._askTarget(row, why),
    newNotebook: async dir =>
      (
        await this._app.serviceManager.contents.newUntitled({
          path: dir,
          type: 'notebook'
        })
      ).path,
    deleteFile: path => this._app.serviceManager.contents.delete(path),
    resume: (id, path) => this._api.resume(id, path ? { path } : {}),
    open: async (path, kernelId) => {
      const open = path ? this._docManager.findWidget(path) : undefined;
      if (open) {
        // the server moved the session already; this only switches the open widget
        await open.context.sessionContext.changeKernel({ id: kernelId });
        this._app.shell.activateById(open.id);
      } else {
        this._openOn(path, kernelId);
      }
    },
    openConsole: kernelId => this._openConsole(kernelId)
  };

  /** Delete the row's image after a confirmation that names the image (its notebook
   * file is not touched, and the wording must not suggest it is). */
  remove(row: ISessionRow): Promise<void> {
    return this._sessions.act(row.image.id, () => this._remove(row));
  }

  private async _remove(row: ISessionRow): Promise<void> {
    const trans = this._trans;
    const image = imageLabel(row.image);
    if (this._settings().confirmDelete) {
      const result = await showDialog({
        title: trans.__('Delete Saved Image?'),
        body: row.notebook
          ? trans.__(
              'Delete image %1 of %2? Its variables cannot be restored afterwards. The notebook file is not changed.',
              image,
              row.notebook
            )
          : trans.__(
              'Delete image %1? Its variables cannot be restored afterwards.',
              image
            ),
        buttons: [
          Dialog.cancelButton({ label: trans.__('Cancel') }),
          Dialog.warnButton({ label: trans.__('Delete image') })
        ]
      });
      if (!result.button.accept) {
        return;
      }
    }
    this._sessions.clearNote(row.image.id);
    try {
      await this._api.deleteImage(row.image.id);
      this._success(trans.__('Deleted image %1.', image));
    } catch (error) {
      // e.g. refused because a kernel was suspended to it meanwhile
      const message = trans.__(
        'Image %1 not deleted: %2',
        image,
        refusalText(reason(error))
      );
      this._sessions.note(row.image.id, message);
      this.failure(trans.__('Image %1 not deleted', image), reason(error));
    }
    await this._sessions.refresh();
  }

  /** The image's variables, and what changed since the image saved before it in the
   * same entry (asked for too; without it, the dialog says there is none). */
  details(row: ISessionRow): Promise<void> {
    return this._sessions.act(row.image.id, async () => {
      try {
        const before = previousInEntry(this._sessions.allRows, row.image.id);
        const [image, previous] = await Promise.all([
          this._api.getImage(row.image.id),
          before && before.image.state !== 'invalid'
            ? this._api.getImage(before.image.id).catch(() => null)
            : null
        ]);
        await showDetails(row.title, image, previous, this._trans);
      } catch (error) {
        this.failure(
          this._trans.__('Could not load the details of %1', row.title),
          reason(error)
        );
      }
    });
  }

  private async _write(
    what: 'Checkpoint' | 'Suspend',
    kernelId: string,
    call: () => Promise<IWriteReply>
  ): Promise<void> {
    const trans = this._trans;
    const id = Notification.emit(
      what === 'Checkpoint'
        ? trans.__('Saving the kernel state…')
        : trans.__('Suspending the kernel…'),
      'in-progress',
      { autoClose: false }
    );
    let failure: string | null = null;
    try {
      const reply = await call();
      const names = Object.keys(reply.lost ?? {});
      const done = reply.unchanged
        ? what === 'Checkpoint'
          ? trans.__(
              'Nothing changed since image %1 (%2): no new image written.',
              reply.name,
              shortId(reply.id)
            )
          : trans.__(
              'Kernel suspended to image %1 (%2), unchanged since it was saved.',
              reply.name,
              shortId(reply.id)
            )
        : what === 'Checkpoint'
          ? trans.__(
              'Kernel state saved: image %1 (%2).',
              reply.name,
              formatBytes(reply.bytes)
            )
          : trans.__(
              'Kernel suspended: image %1 (%2).',
              reply.name,
              formatBytes(reply.bytes)
            );
      if (names.length) {
        Notification.dismiss(id);
        this._unsaveable(kernelId, reply.lost, done, false);
      } else if (this._settings().successNotifications) {
        Notification.update({
          id,
          message: done,
          type: 'success',
          autoClose: SUCCESS_MS
        });
      } else {
        Notification.dismiss(id);
      }
    } catch (error) {
      failure = reason(error);
      Notification.dismiss(id);
    }
    // this kernel alone: a refresh of every kernel in flight may have been asked for
    // while the suspend ran, and would show it still suspending
    await Promise.all([
      this._sessions.refresh(),
      this._kernels.refresh(kernelId).catch(() => undefined)
    ]);
    if (failure === null) {
      return;
    }
    // a suspend refused for variables that cannot be saved: the server names them
    const lost = this._kernels.kernel(kernelId)?.last_failure?.lost ?? {};
    if (what === 'Suspend' && Object.keys(lost).length) {
      this._unsaveable(kernelId, lost, trans.__('Not suspended.'), true);
    } else {
      this.failure(
        what === 'Checkpoint'
          ? trans.__('Could not save the kernel state')
          : trans.__('Could not suspend the kernel'),
        failure
      );
    }
  }

  /**
   * Variables that cannot be saved, as a notification short enough to be read whole,
   * with what the user can do: see why, leave them out of the kernel's saved state
   * (`%ckpt exclude`), or (`suspend`) suspend now all the same, losing them.
   */
  private _unsaveable(
    kernelId: string,
    lost: Record<string, string>,
    lead: string,
    offerSuspend: boolean
  ): void {
    const trans = this._trans;
    const names = Object.keys(lost);
    const list = nameList(names);
    const actions: Notification.IAction[] = [
      {
        label: trans.__('Show details'),
        callback: event => {
          event.preventDefault(); // the notification stays until the user acts
          void this._showUnsaveable(lost);
        }
      },
      {
        label:
          names.length === 1
            ? trans.__('Exclude it')
            : trans.__('Exclude them'),
        caption: trans.__(
          "Leave %1 out of this kernel's saved state from now on; the kernel keeps the values",
          list
        ),
        callback: () => void this._exclude(kernelId, names)
      }
    ];
    if (offerSuspend) {
      actions.push({
        label: trans.__('Suspend anyway, losing %1', list),
        displayType: 'warn',
        callback: () =>
          void this._exclude(kernelId, names, false).then(ok => {
            if (ok) {
              return this.suspend(kernelId);
            }
          })
      });
    }
    Notification.warning(trans.__('%1 %2 cannot be saved.', lead, list), {
      autoClose: false,
      actions
    });
  }

  private async _showUnsaveable(lost: Record<string, string>): Promise<void> {
    const trans = this._trans;
    const list = document.createElement('ul');
    for (const [name, why] of Object.entries(lost)) {
      const item = document.createElement('li');
      item.textContent = `${unsaveableText(name, why)} (${why})`;
      list.appendChild(item);
    }
    const body = document.createElement('div');
    body.append(
      list,
      Object.assign(document.createElement('p'), {
        textContent: trans.__(
          'Delete these variables in the notebook, or exclude them from the saved state, so that the kernel can be suspended with everything else kept.'
        )
      })
    );
    await showDialog({
      title: trans.__('Variables That Cannot Be Saved'),
      body: new Widget({ node: body }),
      buttons: [Dialog.okButton({ label: trans.__('Close') })]
    });
  }

  /** Run `%ckpt exclude` in the kernel; whether it worked. */
  private async _exclude(
    kernelId: string,
    names: string[],
    report = true
  ): Promise<boolean> {
    const trans = this._trans;
    try {
      await this._runSilently(kernelId, excludeCode(names));
    } catch (error) {
      this.failure(
        trans.__('Could not exclude %1', nameList(names)),
        reason(error)
      );
      return false;
    }
    if (report) {
      this._success(
        trans.__(
          "%1 will be left out of this kernel's saved state.",
          nameList(names)
        )
      );
    }
    await this._kernels.refresh(kernelId).catch(() => undefined);
    return true;
  }

  /** Have the kernel save variables it left out again (`%ckpt include`), from its next
   * save on; whether it worked. */
  async include(kernelId: string, names: string[]): Promise<boolean> {
    const trans = this._trans;
    try {
      await this._runSilently(kernelId, includeCode(names));
    } catch (error) {
      this.failure(
        trans.__('Could not save %1 again', nameList(names)),
        reason(error)
      );
      return false;
    }
    this._success(
      trans.__(
        "%1 will be saved in this kernel's images again.",
        nameList(names)
      )
    );
    return true;
  }

  /**
   * A kernel restored without variables its image left out on purpose: said in plain
   * words (no failure), with the cells that make them again and the way to have them
   * saved again.
   */
  noteLeftOut(
    kernelId: string,
    names: string[],
    cells: Record<string, number>
  ): void {
    const trans = this._trans;
    Notification.info(leftOutNotice(names, cells, trans), {
      autoClose: false,
      actions: [
        {
          label:
            names.length === 1
              ? trans.__('Save it again')
              : trans.__('Save them again'),
          caption: trans.__(
            "Save %1 in this kernel's images again once you have made them again",
            nameList(names)
          ),
          callback: () => void this.include(kernelId, names)
        }
      ]
    });
  }

  /** Run `code` in the kernel without a trace in any notebook; rejects with why not. */
  private async _runSilently(kernelId: string, code: string): Promise<void> {
    const trans = this._trans;
    const kernels = this._app.serviceManager.kernels;
    const model = [...kernels.running()].find(k => k.id === kernelId);
    if (!model) {
      throw new Error(trans.__('the kernel is no longer running'));
    }
    const kernel = kernels.connectTo({ model, handleComms: false });
    try {
      const reply = await kernel.requestExecute({
        code,
        silent: true,
        store_history: false
      }).done;
      if (reply.content.status !== 'ok') {
        throw new Error(
          trans.__('the kernel answered %1', reply.content.status)
        );
      }
    } finally {
      kernel.dispose();
    }
  }

  /** A failure as one short sentence (no server paths, no errno); the server's whole
   * message, with its advice, behind Show details. */
  failure(lead: string, why: string): void {
    const trans = this._trans;
    Notification.error(`${lead}: ${shortReason(why)}.`, {
      autoClose: false,
      actions: [
        {
          label: trans.__('Show details'),
          callback: event => {
            event.preventDefault(); // the notification stays until the user acts
            void showDialog({
              title: lead,
              body: why,
              buttons: [Dialog.okButton({ label: trans.__('Close') })]
            });
          }
        }
      ]
    });
  }

  private _success(message: string): void {
    if (this._settings().successNotifications) {
      Notification.success(message, { autoClose: SUCCESS_MS });
    }
  }

  private _reportResume(row: ISessionRow, { reply, path }: IResumed): void {
    const trans = this._trans;
    const { excluded = [], cells = {} } = reply.restore;
    const failed: Record<string, string> = {};
    for (const [name, why] of Object.entries(reply.restore.missing ?? {})) {
      if (!excluded.includes(name)) {
        failed[name] = why;
      }
    }
    const names = Object.keys(failed);
    const kernel = shortId(reply.kernel.id);
    const message =
      path === null
        ? trans.__('Resumed %1 in a console on kernel %2.', row.title, kernel)
        : path !== row.notebook
          ? trans.__(
              'Resumed %1 in %2 on kernel %3.',
              row.title,
              baseName(path),
              kernel
            )
          : trans.__('Resumed %1 on kernel %2.', row.title, kernel);
    if (names.length) {
      Notification.warning(
        `${message} ${trans.__('Not restored: %1.', nameList(names))}`,
        {
          autoClose: false,
          actions: [
            {
              label: trans.__('Show details'),
              callback: event => {
                event.preventDefault();
                void this._showUnsaveable(failed);
              }
            }
          ]
        }
      );
    } else {
      this._success(message);
    }
    if (excluded.length) {
      this.noteLeftOut(reply.kernel.id, excluded, cells);
    }
  }

  private async _exists(path: string): Promise<boolean> {
    try {
      await this._app.serviceManager.contents.get(path, { content: false });
      return true;
    } catch {
      return false;
    }
  }

  private _openOn(notebook: string | null, kernelId: string): void {
    if (notebook) {
      this._docManager.openOrReveal(notebook, undefined, { id: kernelId });
    } else {
      void this._app.commands.execute('console:create', {
        kernelPreference: { id: kernelId }
      });
    }
  }

  /** Bring the suspended kernel's console to the front: the open one, else a console
   * reopened on its live session (connecting does not wake the kernel). False when
   * no console session holds it: JupyterLab cannot start one on a suspended kernel. */
  private async _openConsole(kernelId: string): Promise<boolean> {
    for (const widget of this._app.shell.widgets('main')) {
      const context = (
        widget as { sessionContext?: { session?: { kernel?: { id: string } } } }
      ).sessionContext;
      if (context?.session?.kernel?.id === kernelId) {
        this._app.shell.activateById(widget.id);
        return true;
      }
    }
    const manager = this._app.serviceManager.sessions;
    await manager.refreshRunning();
    const session = [...manager.running()].find(
      s => s.type === 'console' && s.kernel?.id === kernelId
    );
    if (!session) {
      return false;
    }
    await this._app.commands.execute('console:create', {
      path: session.path,
      name: session.name
    });
    return true;
  }

  /** Ask where to resume a row whose notebook cannot be used: a notebook the user
   * picks (next to the original), a new notebook, or a console. */
  private async _askTarget(
    row: ISessionRow,
    why: AskReason
  ): Promise<ITargetChoice | null> {
    const trans = this._trans;
    const notebooks = await this._notebooksNear(row);
    const body =
      why === 'notebook-gone'
        ? trans.__(
            '%1 was renamed or deleted. Where should its saved state be resumed?',
            row.notebook ?? row.title
          )
        : trans.__(
            'The console of %1 is closed, and a closed console cannot be reopened on its suspended kernel. Where should its saved state be resumed?',
            row.title
          );
    const pick = Dialog.createButton({ label: trans.__('Pick a Notebook…') });
    const fresh = Dialog.createButton({ label: trans.__('New Notebook') });
    const console = Dialog.okButton({ label: trans.__('Console') });
    const result = await showDialog({
      title: trans.__('Resume %1', row.title),
      body,
      buttons: [
        Dialog.cancelButton({ label: trans.__('Cancel') }),
        ...(notebooks.length ? [pick] : []),
        fresh,
        console
      ],
      defaultButton: notebooks.length ? 3 : 2
    });
    if (result.button.label === console.label) {
      return { target: 'console' };
    }
    if (result.button.label === fresh.label) {
      return { target: 'new-notebook' };
    }
    if (result.button.label !== pick.label) {
      return null;
    }
    const chosen = await InputDialog.getItem({
      title: trans.__('Resume %1 in Notebook', row.title),
      label: trans.__(
        'Its kernel replaces the kernel of the notebook you pick.'
      ),
      items: notebooks,
      okLabel: trans.__('Resume'),
      cancelLabel: trans.__('Cancel')
    });
    return chosen.button.accept && chosen.value
      ? { target: 'notebook', path: chosen.value }
      : null;
  }

  /** The notebooks in the directory of the row's notebook (the root if it is gone). */
  private async _notebooksNear(row: ISessionRow): Promise<string[]> {
    const contents = this._app.serviceManager.contents;
    for (const dir of [newNotebookDir(row), '']) {
      try {
        const listing = await contents.get(dir, { content: true });
        return (listing.content as { type: string; path: string }[])
          .filter(item => item.type === 'notebook')
          .map(item => item.path)
          .sort();
      } catch {
        // the directory went with the notebook: look in the root
      }
    }
    return [];
  }

  private async _confirmStop(warning: string): Promise<boolean> {
    const trans = this._trans;
    const result = await showDialog({
      title: trans.__('Stop Background Work?'),
      body: warning,
      buttons: [
        Dialog.cancelButton({ label: trans.__('Cancel') }),
        Dialog.warnButton({ label: trans.__('Suspend anyway') })
      ]
    });
    return result.button.accept;
  }

  /** Ask before replacing a notebook's kernel that runs (open or not); a suspended one
   * keeps its image, so it is replaced without asking. */
  private async _confirmReplace(notebook: string): Promise<boolean> {
    if (!this._settings().confirmReplace) {
      return true;
    }
    const trans = this._trans;
    const manager = this._app.serviceManager.sessions;
    await Promise.all([
      manager.refreshRunning(),
      this._kernels.refresh().catch(() => undefined)
    ]);
    const current = [...manager.running()].find(s => s.path === notebook)
      ?.kernel?.id;
    if (!current || this._kernels.isSuspended(current)) {
      return true;
    }
    const result = await showDialog({
      title: trans.__('Replace the Kernel?'),
      body: trans.__(
        '%1 has a running kernel. Resuming saves its variables to an image (labelled "replaced" in Saved Sessions, where you can resume it later), shuts it down and connects the notebook to the restored kernel. If that save fails, its variables are lost.',
        notebook
      ),
      buttons: [
        Dialog.cancelButton({ label: trans.__('Cancel') }),
        Dialog.warnButton({ label: trans.__('Replace kernel') })
      ]
    });
    return result.button.accept;
  }
}
