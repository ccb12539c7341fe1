/**
 * Where a saved image is resumed: its own notebook (the default), a new notebook, or a
 * console. Kept apart from the JupyterLab services it drives (`IResumeHost`), so that
 * the rule "never two kernels for one notebook" can be tested on its own.
 */

import { ISessionRow } from './sessions';
import { IResumeReply } from './types';

export type ResumeTarget = 'notebook' | 'new-notebook' | 'console';

/** One entry of a row's Resume menu. */
export interface IResumeChoice {
  target: ResumeTarget;
  /** Title Case, as JupyterLab's menus name commands. */
  label: string;
  /** The tooltip: what happens, or why the entry is disabled. */
  caption: string;
  enabled: boolean;
}

/** The ways to resume a row's image, in menu order. */
export function resumeChoices(row: ISessionRow): IResumeChoice[] {
  const own: IResumeChoice = row.suspendedKernel
    ? {
        target: 'notebook',
        label: 'Open Its Notebook',
        caption: row.notebook
          ? `Open ${row.notebook} on its suspended kernel; running a cell restores it`
          : 'Open a console on the suspended kernel; running a cell restores it',
        enabled: true
      }
    : {
        target: 'notebook',
        label: 'Resume in Its Notebook',
        caption: row.notebook
          ? `Start a kernel restored from this image as the kernel of ${row.notebook} (if that file is gone, you choose where)`
          : 'The image records no notebook: resume it in a new notebook or a console',
        enabled: !!row.notebook
      };
  return [
    own,
    {
      target: 'new-notebook',
      label: 'Resume in New Notebook',
      caption:
        'Create an untitled notebook next to the original and start a kernel restored from this image for it',
      enabled: true
    },
    {
      target: 'console',
      label: 'Resume in Console',
      caption:
        'Start a kernel restored from this image and open a console on it; no notebook is changed',
      enabled: true
    }
  ];
}

/** The directory a new notebook for the row goes to: the original's, so that relative
 * file paths in the restored variables' code still work. */
export function newNotebookDir(row: ISessionRow): string {
  const notebook = row.notebook ?? '';
  const slash = notebook.lastIndexOf('/');
  return slash < 0 ? '' : notebook.slice(0, slash);
}

/** Where the user chose to resume an image whose notebook cannot be used: another
 * notebook (`path`), a new notebook, or a console. */
export type ITargetChoice =
  | { target: 'notebook'; path: string }
  | { target: 'new-notebook' }
  | { target: 'console' };

/** Why `resumeInto` asks where to resume: its notebook file is gone (renamed elsewhere
 * or deleted), or its suspended kernel's console is closed and cannot be reopened. */
export type AskReason = 'notebook-gone' | 'console-closed';

/** What `resumeInto` needs from JupyterLab and the server. */
export interface IResumeHost {
  exists(path: string): Promise<boolean>;
  /** Whether the kernel is still suspended, asked now: a kernel shut down since the
   * list was loaded is gone, and only its image is left to resume. */
  isSuspended(kernelId: string): Promise<boolean>;
  /** Ask before replacing the notebook's running kernel; false: the user declined. */
  confirmReplace(path: string): Promise<boolean>;
  /** Ask where to resume instead; null: the user cancelled. */
  askTarget(row: ISessionRow, why: AskReason): Promise<ITargetChoice | null>;
  /** Create an untitled notebook in `dir`; its path. */
  newNotebook(dir: string): Promise<string>;
  deleteFile(path: string): Promise<void>;
  /** `POST /api/ckpt/images/{id}/resume`, bound to `path` when given. */
  resume(imageId: string, path: string | null): Promise<IResumeReply>;
  /** Show `kernelId` in the notebook at `path`, or in a console when null. */
  open(path: string | null, kernelId: string): Promise<void>;
  /** Show the suspended kernel's console, reopened from its live session; false when
   * it has none (closed), and JupyterLab cannot start a console on that kernel. */
  openConsole(kernelId: string): Promise<boolean>;
}

/** What a resume ended with: the kernel restored, where it is shown (null: a console). */
export interface IResumed {
  reply: IResumeReply;
  path: string | null;
}

/**
 * Resume the row's image into `target`; null when nothing was restored (the user
 * declined, or the row's suspended kernel was just opened).
 *
 * The kernel restored for a notebook is bound to it by the server, which shuts down
 * the kernel it had: the notebook never has two. A new notebook or a console gets a
 * kernel of its own, and the source notebook's kernel is left as it is. The list may be
 * older than what the user did since, so what it says is checked again here: a
 * suspended kernel shut down meanwhile is resumed from its image, and a notebook file
 * renamed or deleted meanwhile makes it ask where to resume rather than guess.
 */
export async function resumeInto(
  row: ISessionRow,
  target: ResumeTarget,
  host: IResumeHost
): Promise<IResumed | null> {
  if (target !== 'notebook') {
    return resumeAt(
      row,
      target === 'console' ? { target } : { target: 'new-notebook' },
      host
    );
  }
  const notebook =
    row.notebook && !row.notebookGone && (await host.exists(row.notebook))
      ? row.notebook
      : null;
  const suspended =
    row.suspendedKernel !== null &&
    (await host.isSuspended(row.suspendedKernel));
  if (suspended && notebook) {
    await host.open(notebook, row.suspendedKernel!);
    return null;
  }
  if (suspended && !row.notebook) {
    if (await host.openConsole(row.suspendedKernel!)) {
      return null;
    }
    const choice = await host.askTarget(row, 'console-closed');
    return choice ? resumeAt(row, choice, host) : null;
  }
  if (row.notebook && !notebook) {
    const choice = await host.askTarget(row, 'notebook-gone');
    return choice ? resumeAt(row, choice, host) : null;
  }
  return resumeAt(
    row,
    notebook ? { target: 'notebook', path: notebook } : { target: 'console' },
    host
  );
}

/** Resume the row's image where `choice` says; null when the user declined to replace
 * the chosen notebook's running kernel. */
async function resumeAt(
  row: ISessionRow,
  choice: ITargetChoice,
  host: IResumeHost
): Promise<IResumed | null> {
  if (choice.target === 'console') {
    const reply = await host.resume(row.image.id, null);
    await host.open(null, reply.kernel.id);
    return { reply, path: null };
  }
  if (choice.target === 'new-notebook') {
    const path = await host.newNotebook(newNotebookDir(row));
    let reply: IResumeReply;
    try {
      reply = await host.resume(row.image.id, path);
    } catch (error) {
      // an empty "Untitled" left behind by a resume that failed would only confuse
      await host.deleteFile(path).catch(() => undefined);
      throw error;
    }
    await host.open(path, reply.kernel.id);
    return { reply, path };
  }
  if (!(await host.confirmReplace(choice.path))) {
    return null;
  }
  const reply = await host.resume(row.image.id, choice.path);
  await host.open(choice.path, reply.kernel.id);
  return { reply, path: choice.path };
}

/** The commands of the row's Resume menu and context menu; args: `{ imageId }`. */
export const RESUME_COMMANDS: Record<ResumeTarget, string> = {
  notebook: 'jupyter-ckpt:resume-in-notebook',
  'new-notebook': 'jupyter-ckpt:resume-in-new-notebook',
  console: 'jupyter-ckpt:resume-in-console'
};
