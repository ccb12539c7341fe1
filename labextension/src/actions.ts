/** What the panel's buttons and the commands do; failures become notifications. */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';

import { showDetails } from './details';
import {
  baseName,
  formatBytes,
  savedName,
  shortenIds,
  shortId
} from './format';
import { confirmSuspend, KernelStatusModel } from './kernelstatus';
import { IRowActions } from './panel';
import { IResumed, IResumeHost, ResumeTarget, resumeInto } from './resume';
import { imageLabel, ISessionRow, SavedSessionsModel } from './sessions';
import { ICkptApi, IWriteReply } from './types';

function reason(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** "Not saved: gen (TypeError: cannot pickle 'generator' object)" or "". */
function lostText(lost: Record<string, string> | undefined): string {
  const entries = Object.entries(lost ?? {});
  return entries.length
    ? ` Not saved: ${entries.map(([name, why]) => `${name} (${why})`).join('; ')}.`
    : '';
}

export class CkptActions implements IRowActions {
  constructor(
    private readonly _app: JupyterFrontEnd,
    private readonly _docManager: IDocumentManager,
    private readonly _api: ICkptApi,
    private readonly _sessions: SavedSessionsModel,
    private readonly _kernels: KernelStatusModel
  ) {}

  /** Save now, under a name of its own (`savedName`): a state the user chose to keep,
   * marked as named in the panel like `%ckpt save NAME`, not one of the images idle
   * cycles write under the notebook's name. */
  async checkpoint(kernelId: string): Promise<void> {
    await this._write('Checkpoint', kernelId, () =>
      this._api.checkpoint(kernelId, savedName(new Date()))
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

  /** Resume the row's image into its notebook (the default: opened if closed, a
   * console when the file is gone; a suspended kernel's row opens its notebook as it
   * is), a new notebook, or a console (see `resumeInto`). The server makes the restored
   * kernel a notebook's only one: the kernel it had, open or not, is shut down, after the
   * user agreed when it runs with state to lose. */
  async resume(
    row: ISessionRow,
    target: ResumeTarget = 'notebook'
  ): Promise<void> {
    this._sessions.clearNote(row.image.id);
    try {
      const resumed = await resumeInto(row, target, this._resumeHost);
      if (resumed) {
        this._reportResume(row, resumed);
      }
    } catch (error) {
      Notification.error(`Could not resume ${row.title}: ${reason(error)}`, {
        autoClose: false
      });
    }
    void this._sessions.refresh();
  }

  private readonly _resumeHost: IResumeHost = {
    exists: path => this._exists(path),
    confirmReplace: path => this._confirmReplace(path),
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
    }
  };

  /** Delete the row's image after a confirmation that names the image (its notebook
   * file is not touched, and the wording must not suggest it is). */
  async remove(row: ISessionRow): Promise<void> {
    const image = imageLabel(row.image);
    const result = await showDialog({
      title: 'Delete saved image?',
      body: `Delete image ${image}${row.notebook ? ` of ${row.notebook}` : ''}? Its variables cannot be restored afterwards. The notebook file is not changed.`,
      buttons: [
        Dialog.cancelButton(),
        Dialog.warnButton({ label: 'Delete image' })
      ]
    });
    if (!result.button.accept) {
      return;
    }
    this._sessions.clearNote(row.image.id);
    try {
      await this._api.deleteImage(row.image.id);
      Notification.success(`Deleted image ${image}.`, { autoClose: 5000 });
    } catch (error) {
      // e.g. refused because a kernel was suspended to it meanwhile
      const message = `Image ${image} not deleted: ${shortenIds(reason(error))}`;
      this._sessions.note(row.image.id, message);
      Notification.error(message, { autoClose: false });
    }
    await this._sessions.refresh();
  }

  async details(row: ISessionRow): Promise<void> {
    try {
      await showDetails(row.title, await this._api.getImage(row.image.id));
    } catch (error) {
      Notification.error(
        `Could not load the details of ${row.title}: ${reason(error)}`
      );
    }
  }

  private async _write(
    what: 'Checkpoint' | 'Suspend',
    kernelId: string,
    call: () => Promise<IWriteReply>
  ): Promise<void> {
    const id = Notification.emit(
      `${what === 'Checkpoint' ? 'Checkpointing' : 'Suspending'} the kernel…`,
      'in-progress',
      { autoClose: false }
    );
    try {
      const reply = await call();
      const lost = lostText(reply.lost);
      Notification.update({
        id,
        message: `${what === 'Checkpoint' ? 'Checkpoint saved' : 'Kernel suspended'}: image ${reply.name} (${formatBytes(reply.bytes)}).${lost}`,
        type: lost ? 'warning' : 'success',
        autoClose: lost ? false : 5000
      });
    } catch (error) {
      Notification.update({
        id,
        message: `${what} failed: ${reason(error)}`,
        type: 'error',
        autoClose: false
      });
    }
    // this kernel alone: a refresh of every kernel in flight may have been asked for
    // while the suspend ran, and would show it still suspending
    await Promise.all([
      this._sessions.refresh(),
      this._kernels.refresh(kernelId).catch(() => undefined)
    ]);
  }

  private _reportResume(row: ISessionRow, { reply, path }: IResumed): void {
    const missing = lostText(reply.restore.missing);
    const where =
      path === null
        ? ' in a console'
        : path !== row.notebook
          ? ` in ${baseName(path)}`
          : '';
    const message = `Resumed ${row.title}${where} on kernel ${shortId(reply.kernel.id)}.${missing}`;
    if (missing) {
      Notification.warning(message, { autoClose: false });
    } else {
      Notification.success(message, { autoClose: 5000 });
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

  private async _confirmStop(warning: string): Promise<boolean> {
    const result = await showDialog({
      title: 'Stop background work?',
      body: warning,
      buttons: [
        Dialog.cancelButton(),
        Dialog.warnButton({ label: 'Suspend anyway' })
      ]
    });
    return result.button.accept;
  }

  /** Ask before replacing a notebook's kernel that runs (open or not); a suspended one
   * keeps its image, so it is replaced without asking. */
  private async _confirmReplace(notebook: string): Promise<boolean> {
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
      title: 'Replace the kernel?',
      body: `${notebook} has a running kernel. Resuming shuts it down and connects the notebook to the restored kernel; the running kernel's variables are lost unless you save its state first.`,
      buttons: [
        Dialog.cancelButton(),
        Dialog.warnButton({ label: 'Replace kernel' })
      ]
    });
    return result.button.accept;
  }
}
