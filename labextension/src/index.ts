/** jupyter-ckpt for JupyterLab: saved-sessions sidebar, kernel status, commands. */

import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  ISessionContext,
  Notification
} from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Event } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { pauseIcon } from '@jupyterlab/ui-components';
import { Poll } from '@lumino/polling';

import { CkptActions } from './actions';
import { CkptApi } from './api';
import { ckptIcon } from './icon';
import {
  commandBlocked,
  eventNotice,
  IBlocked,
  KernelStatusModel
} from './kernelstatus';
import { SavedSessionsPanel } from './panel';
import { RESUME_COMMANDS, resumeChoices, ResumeTarget } from './resume';
import { rowActions, SavedSessionsModel } from './sessions';
import { KernelStatusItem } from './statusitem';
import { EVENT_SCHEMA, ICkptEvent } from './types';

namespace CommandIDs {
  export const checkpoint = 'jupyter-ckpt:checkpoint';
  export const suspend = 'jupyter-ckpt:suspend';
  export const showPanel = 'jupyter-ckpt:show-saved-sessions';
}

/** A safety net for changes no event reports (a `%ckpt save` inside a kernel). The REST
 * routes it polls do not count as activity, so the server can still go idle. */
const POLL_INTERVAL_MS = 60 * 1000;

function activate(
  app: JupyterFrontEnd,
  docManager: IDocumentManager,
  tracker: INotebookTracker,
  palette: ICommandPalette | null,
  mainMenu: IMainMenu | null,
  statusBar: IStatusBar | null,
  labShell: ILabShell | null
): void {
  const api = new CkptApi(app.serviceManager.serverSettings);
  const kernelPaths = () =>
    new Map(
      [...app.serviceManager.sessions.running()]
        .filter(s => s.kernel && s.type === 'notebook')
        .map(s => [s.kernel!.id, s.path] as [string, string])
    );
  const sessions = new SavedSessionsModel(
    api,
    kernelPaths,
    PageConfig.getOption('serverRoot')
  );
  const kernels = new KernelStatusModel(api);
  const actions = new CkptActions(app, docManager, api, sessions, kernels);
  const panel = new SavedSessionsPanel(
    sessions,
    kernels,
    actions,
    app.commands
  );
  app.shell.add(panel, 'left', { rank: 700 });

  const poll = new Poll({
    factory: () => Promise.all([sessions.refresh(), kernels.refresh()]),
    frequency: {
      interval: POLL_INTERVAL_MS,
      backoff: true,
      max: 10 * POLL_INTERVAL_MS
    },
    name: 'jupyter-ckpt:refresh',
    standby: 'when-hidden'
  });
  app.serviceManager.events.stream.connect((_, event: Event.Emission) => {
    if (event.schema_id !== EVENT_SCHEMA) {
      return;
    }
    const ckptEvent = event as unknown as ICkptEvent;
    kernels.noteEvent(ckptEvent);
    if (ckptEvent.action === 'progress') {
      return; // a few a second while an image moves: nothing to reload yet
    }
    void poll.refresh();
    const notice = eventNotice(ckptEvent);
    if (notice) {
      Notification.error(notice, { autoClose: false });
    }
  });

  const currentKernel = (): string | null =>
    tracker.currentWidget?.sessionContext.session?.kernel?.id ?? null;
  const whyNot = (): IBlocked | null =>
    commandBlocked(
      currentKernel(),
      id => kernels.isSuspended(id),
      kernels.available
    );
  const withKernel = (run: (id: string) => Promise<void>) => () => {
    const id = currentKernel();
    return id ? run(id) : undefined;
  };
  // the commands stay in menus, the palette and the toolbar when they cannot run,
  // saying why: in a few words in the label, in full in the caption (tooltip)
  const caption = (what: string) => () => {
    const blocked = whyNot();
    return blocked ? `${what} Not available now: ${blocked.long}` : what;
  };
  const label = (name: string) => (args: { [key: string]: unknown }) => {
    if (args.toolbar) {
      return '';
    }
    const blocked = whyNot();
    return blocked ? `${name} (${blocked.short})` : name;
  };
  app.commands.addCommand(CommandIDs.checkpoint, {
    label: label('Save Kernel State Now'),
    caption: caption(
      "Save the kernel's variables to an image; the kernel keeps running."
    ),
    icon: args => (args.toolbar ? ckptIcon : undefined),
    isEnabled: () => whyNot() === null,
    execute: withKernel(id => actions.checkpoint(id))
  });
  app.commands.addCommand(CommandIDs.suspend, {
    label: label('Suspend Kernel Now'),
    caption: caption(
      "Save the kernel's variables to an image and shut the kernel down to free its GPU; running a cell restores it."
    ),
    icon: args => (args.toolbar ? pauseIcon : undefined),
    isEnabled: () => whyNot() === null,
    execute: withKernel(id => actions.suspend(id))
  });
  app.commands.addCommand(CommandIDs.showPanel, {
    label: 'Show Saved Sessions',
    caption: 'Suspended kernels and saved kernel images',
    icon: args => (args.isPalette ? undefined : ckptIcon),
    execute: () => app.shell.activateById(panel.id)
  });
  const ids = [CommandIDs.checkpoint, CommandIDs.suspend, CommandIDs.showPanel];
  for (const command of ids) {
    palette?.addItem({ command, category: 'Kernel' });
  }
  mainMenu?.kernelMenu.addGroup(
    ids.map(command => ({ command })),
    50
  );
  // Resume in its notebook, a new notebook or a console: from the Resume button's
  // menu (args.imageId) or the row's context menu (the row under the pointer)
  const rowOf = (args: { [key: string]: unknown }) => {
    const imageId =
      typeof args.imageId === 'string'
        ? args.imageId
        : app.contextMenuHitTest(node => !!node.dataset.imageId)?.dataset
            .imageId;
    return imageId ? panel.rowOf(imageId) : undefined;
  };
  const choice = (target: ResumeTarget, args: { [key: string]: unknown }) => {
    const row = rowOf(args);
    return row ? resumeChoices(row).find(c => c.target === target) : undefined;
  };
  for (const [target, command] of Object.entries(RESUME_COMMANDS) as [
    ResumeTarget,
    string
  ][]) {
    const fallback = resumeChoices({
      image: { id: '', state: 'saved' },
      notebook: 'notebook',
      title: '',
      suspendedKernel: null
    }).find(c => c.target === target)!;
    app.commands.addCommand(command, {
      label: args => (choice(target, args) ?? fallback).label,
      caption: args => (choice(target, args) ?? fallback).caption,
      isEnabled: args => {
        const row = rowOf(args);
        return (
          !!row &&
          rowActions(row.image).includes('resume') &&
          !!choice(target, args)?.enabled
        );
      },
      execute: args => {
        const row = rowOf(args);
        return row ? actions.resume(row, target) : undefined;
      }
    });
    app.contextMenu.addItem({
      command,
      selector: '.jp-CkptPanel .jp-CkptRow[data-image-id]',
      rank: 1
    });
  }

  kernels.changed.connect(() => app.commands.notifyCommandChanged());
  tracker.currentChanged.connect(() => app.commands.notifyCommandChanged());

  if (statusBar) {
    const item = new KernelStatusItem(kernels, () =>
      app.shell.activateById(panel.id)
    );
    // the item follows the notebook or console in front; other documents hide it
    const follow = () => {
      const current = labShell ? labShell.currentWidget : tracker.currentWidget;
      item.session = sessionContextOf(current);
    };
    tracker.currentChanged.connect(follow);
    labShell?.currentChanged.connect(follow);
    follow();
    statusBar.registerStatusItem('jupyter-ckpt:kernel-status', {
      item,
      align: 'left',
      rank: 4,
      isActive: () => item.kernelId !== null,
      activeStateChanged: item.activeStateChanged
    });
  }
}

/** The kernel session of a notebook or console panel (both have one); null for any
 * other widget. A console is found by its shape, as the console package is not needed
 * for anything else. */
function sessionContextOf(widget: unknown): ISessionContext | null {
  const context = (widget as { sessionContext?: ISessionContext } | null)
    ?.sessionContext;
  return context && 'kernelChanged' in context ? context : null;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-ckpt:plugin',
  description:
    'Saved sessions panel, kernel suspend status and checkpoint commands.',
  autoStart: true,
  requires: [IDocumentManager, INotebookTracker],
  optional: [ICommandPalette, IMainMenu, IStatusBar, ILabShell],
  activate
};

export default plugin;
