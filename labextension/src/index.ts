/** jupyter-ckpt for JupyterLab: saved-sessions sidebar, kernel status, commands. */

import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  InputDialog,
  ISessionContext,
  Notification
} from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { IMainMenu } from '@jupyterlab/mainmenu';
import {
  INotebookTracker,
  NotebookActions,
  NotebookPanel
} from '@jupyterlab/notebook';
import { Contents } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';
import { pauseIcon } from '@jupyterlab/ui-components';
import { Poll } from '@lumino/polling';

import { CkptActions, DEFAULT_SETTINGS, ICkptSettings } from './actions';
import { CkptApi } from './api';
import { BulkDelete } from './bulk';
import { relativeTime } from './format';
import { ckptIcon } from './icon';
import {
  commandBlocked,
  eventNotice,
  IBlocked,
  KernelStatusModel
} from './kernelstatus';
import { addListCommands, rememberSort } from './listcommands';
import { SavedSessionsPanel } from './panel';
import { RESUME_COMMANDS, resumeChoices, ResumeTarget } from './resume';
import { rowActions, SavedSessionsModel } from './sessions';
import { KernelStatusItem } from './statusitem';
import { followEvents } from './liveevents';
import { markRunningKernels } from './runningmark';

namespace CommandIDs {
  export const checkpoint = 'jupyter-ckpt:checkpoint';
  export const suspend = 'jupyter-ckpt:suspend';
  export const showPanel = 'jupyter-ckpt:show-saved-sessions';
  export const resumePick = 'jupyter-ckpt:resume-saved-session';
}

/** Where JupyterLab's palette lists the commands: beside its own kernel commands. */
const CATEGORY = 'Kernel Operations';

/** A safety net for what no event reports (a `%ckpt save` in a console or another
 * client, which writes to the store itself) and for events missed while the events
 * socket was down (JupyterLab reconnects it, but what was sent meanwhile is lost).
 * Everything else arrives as a server event within a moment (liveevents.ts). The REST
 * routes it polls do not count as activity, so the server can still go idle. */
const POLL_INTERVAL_MS = 60 * 1000;

function activate(
  app: JupyterFrontEnd,
  docManager: IDocumentManager,
  tracker: INotebookTracker,
  palette: ICommandPalette | null,
  mainMenu: IMainMenu | null,
  statusBar: IStatusBar | null,
  labShell: ILabShell | null,
  restorer: ILayoutRestorer | null,
  settingRegistry: ISettingRegistry | null,
  translator: ITranslator | null
): void {
  const trans = (translator ?? nullTranslator).load('jupyter_ckpt');
  const api = new CkptApi(app.serviceManager.serverSettings);
  const manager = app.serviceManager;
  const kernels = new KernelStatusModel(api);
  // the live sessions' kernels: the notebook each runs for, the console each is (not
  // those the server said were shut down, which this page's lists may still hold)
  const live = () => {
    const running = [...manager.sessions.running()].filter(
      s => s.kernel && !kernels.isGone(s.kernel.id)
    );
    const of = (type: string, value: (s: (typeof running)[0]) => string) =>
      new Map(
        running
          .filter(s => s.type === type)
          .map(s => [s.kernel!.id, value(s)] as [string, string])
      );
    return {
      kernelPaths: of('notebook', s => s.path),
      consoles: of('console', s => s.name)
    };
  };
  const sessions = new SavedSessionsModel(
    api,
    live,
    PageConfig.getOption('serverRoot')
  );
  let settings: ICkptSettings = DEFAULT_SETTINGS;
  const actions = new CkptActions(
    app,
    docManager,
    api,
    sessions,
    kernels,
    trans,
    () => settings
  );
  const panel = new SavedSessionsPanel(
    sessions,
    kernels,
    actions,
    app.commands,
    trans
  );
  app.shell.add(panel, 'left', { rank: 700 });
  addListCommands(
    app,
    panel,
    actions,
    new BulkDelete(api, sessions, trans, () => settings),
    kernels,
    trans
  );
  // open after a reload when it was open before
  restorer?.add(panel, panel.id);
  // A cell may have saved an image (`%ckpt save`), which no server event reports: a
  // panel in view reloads its list when a notebook cell finishes, not at the next poll.
  NotebookActions.executed.connect(() => {
    if (panel.isVisible) {
      void sessions.refresh();
    }
  });
  if (settingRegistry) {
    settingRegistry
      .load(plugin.id)
      .then(loaded => {
        const read = () => {
          settings = {
            ...DEFAULT_SETTINGS,
            ...(loaded.composite as Partial<ICkptSettings>)
          };
        };
        read();
        loaded.changed.connect(read);
        return rememberSort(panel, loaded);
      })
      .catch(reason =>
        console.warn(
          'jupyter-ckpt: settings not loaded, using defaults',
          reason
        )
      );
  }

  // the safety net (see POLL_INTERVAL_MS): it lives as long as the page
  new Poll({
    factory: () => Promise.all([sessions.refresh(), kernels.refresh()]),
    frequency: {
      interval: POLL_INTERVAL_MS,
      backoff: true,
      max: 10 * POLL_INTERVAL_MS
    },
    name: 'jupyter-ckpt:refresh',
    standby: 'when-hidden'
  });
  // A kernel shut down, started or moved to another notebook here: the entries follow
  // at once (their state, and whether Open still has a kernel to open), not at the
  // next poll. Only a change of which kernels run where counts; the managers also
  // report every change of a kernel's activity.
  let layout = '';
  const onRunning = () => {
    const now =
      JSON.stringify(
        [...manager.sessions.running()].map(s => [s.id, s.path, s.kernel?.id])
      ) + JSON.stringify([...manager.kernels.running()].map(k => k.id));
    if (now !== layout) {
      layout = now;
      kernels.retain(new Set([...manager.kernels.running()].map(k => k.id)));
      sessions.liveChanged();
      void sessions.refresh();
    }
  };
  manager.sessions.runningChanged.connect(onRunning);
  manager.kernels.runningChanged.connect(onRunning);
  // A notebook renamed or deleted here: the server, which follows each image's
  // notebook by its file id, names its new path (or none) at once. Images written
  // before notebooks had ids follow only the renames made here.
  manager.contents.fileChanged.connect(
    (_: unknown, change: Contents.IChangedArgs) => {
      const from = change.oldValue?.path;
      const to = change.newValue?.path;
      if (change.type === 'rename' && from && to) {
        sessions.noteRename(from, to);
      }
      if (change.type === 'rename' || change.type === 'delete') {
        void sessions.refresh();
      }
    }
  );
  followEvents(manager.events.stream, {
    kernels,
    sessions,
    knowsKernel: id => [...manager.kernels.running()].some(k => k.id === id),
    refreshRunning: async () => {
      await Promise.all([
        manager.sessions.refreshRunning(),
        manager.kernels.refreshRunning()
      ]);
    },
    tell: event => {
      if (event.action === 'restore' && event.excluded?.length) {
        actions.noteLeftOut(
          event.kernel_id ?? '',
          event.excluded,
          event.cells ?? {}
        );
      }
      const notice = eventNotice(event);
      if (notice) {
        actions.failure(notice.lead, notice.why);
      }
    }
  });

  // The widget in front, notebook or console, as JupyterLab's own kernel commands
  // take it: the main area's current widget (the notebook tracker's only without a
  // lab shell). A sidebar or the palette in focus does not change it.
  const currentSession = (): ISessionContext | null =>
    sessionContextOf(labShell ? labShell.currentWidget : tracker.currentWidget);
  const currentKernel = (): string | null =>
    currentSession()?.session?.kernel?.id ?? null;
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
    // the palette's search finds it by the word users know it by, too
    label: args =>
      args.isPalette
        ? trans.__('Save Kernel State Now (Checkpoint)')
        : label(trans.__('Save Kernel State Now'))(args),
    caption: caption(
      trans.__(
        "Save the kernel's variables to an image; the kernel keeps running."
      )
    ),
    icon: args => (args.toolbar ? ckptIcon : undefined),
    isEnabled: () => whyNot() === null,
    execute: withKernel(id => actions.checkpoint(id))
  });
  app.commands.addCommand(CommandIDs.suspend, {
    label: label(trans.__('Suspend Kernel Now')),
    caption: caption(
      trans.__(
        "Save the kernel's variables to an image and shut the kernel down to free its GPU; running a cell restores it."
      )
    ),
    icon: args => (args.toolbar ? pauseIcon : undefined),
    isEnabled: () => whyNot() === null,
    execute: withKernel(id => actions.suspend(id))
  });
  app.commands.addCommand(CommandIDs.showPanel, {
    label: trans.__('Show Saved Sessions'),
    caption: trans.__('Suspended Kernels and Saved Kernel Images'),
    icon: args => (args.isPalette ? undefined : ckptIcon),
    execute: () => app.shell.activateById(panel.id)
  });
  app.commands.addCommand(CommandIDs.resumePick, {
    label: trans.__('Resume Saved Session…'),
    caption: trans.__(
      'Pick a saved session (a checkpoint of a kernel) and resume it in its notebook'
    ),
    execute: () => resumePicked()
  });
  /** The palette's way to the panel's Resume: pick an entry by name. */
  const resumePicked = async (): Promise<void> => {
    await sessions.refresh();
    const now = Date.now();
    const choices = new Map(
      sessions.entries
        .filter(entry => rowActions(entry.latest.image).includes('resume'))
        .map(({ latest }) => [
          latest.image.created
            ? trans.__(
                '%1 (saved %2)',
                latest.title,
                relativeTime(latest.image.created, now)
              )
            : latest.title,
          latest
        ])
    );
    if (choices.size === 0) {
      Notification.info(trans.__('No saved sessions to resume yet.'), {
        autoClose: 5000
      });
      return;
    }
    const picked = await InputDialog.getItem({
      title: trans.__('Resume Saved Session'),
      items: [...choices.keys()],
      okLabel: trans.__('Resume'),
      cancelLabel: trans.__('Cancel')
    });
    const row = picked.button.accept && choices.get(picked.value ?? '');
    if (row) {
      await actions.resume(row);
    }
  };
  const ids = [
    CommandIDs.checkpoint,
    CommandIDs.suspend,
    CommandIDs.showPanel,
    CommandIDs.resumePick
  ];
  for (const command of ids) {
    palette?.addItem({
      command,
      category: trans.__(CATEGORY),
      args: { isPalette: true }
    });
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
      suspendedKernel: null,
      inUse: []
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

  // the commands' labels and enabled states follow the widget in front and its kernel
  const commandsChanged = () => app.commands.notifyCommandChanged();
  let watched: ISessionContext | null = null;
  const followCurrent = () => {
    watched?.kernelChanged.disconnect(commandsChanged);
    watched = currentSession();
    watched?.kernelChanged.connect(commandsChanged);
    commandsChanged();
  };
  kernels.changed.connect(commandsChanged);
  tracker.currentChanged.connect(followCurrent);
  labShell?.currentChanged.connect(followCurrent);
  // JupyterLab's own kernel indicator in the notebook's toolbar knows nothing of
  // suspension: a glyph and a tooltip on it say so while the kernel is suspended
  const markSuspended = () =>
    tracker.forEach(notebook => markToolbar(notebook, kernels, trans));
  kernels.changed.connect(markSuspended);
  tracker.widgetAdded.connect((_, notebook) => {
    notebook.sessionContext.kernelChanged.connect(markSuspended);
    void notebook.revealed.then(markSuspended);
  });

  // JupyterLab's Running panel lists a suspended kernel as any other: marked there
  void app.restored.then(() => {
    const running = document.getElementById('jp-running-sessions');
    if (running) {
      markRunningKernels(
        running,
        kernels,
        trans.__('Suspended'),
        trans.__(
          'Kernel suspended: its variables are saved and it holds no memory. Running a cell restores it.'
        )
      );
    }
  });

  if (statusBar) {
    const item = new KernelStatusItem(kernels, () =>
      app.shell.activateById(panel.id)
    );
    // the item follows the notebook or console in front; other documents hide it
    const follow = () => {
      item.session = currentSession();
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

/** The toolbar's kernel indicator of `notebook`, marked while its kernel is suspended. */
function markToolbar(
  notebook: NotebookPanel,
  kernels: KernelStatusModel,
  trans: ReturnType<ITranslator['load']>
): void {
  const item = notebook.toolbar.node.querySelector<HTMLElement>(
    '[data-jp-item-name="executionProgress"], [data-jp-item-name="kernelStatus"]'
  );
  if (!item) {
    return;
  }
  const id = notebook.sessionContext.session?.kernel?.id;
  const suspended = !!id && kernels.isSuspended(id);
  item.classList.toggle('jp-mod-ckptSuspended', suspended);
  if (suspended) {
    item.title = trans.__(
      'Kernel suspended: its variables are saved and it holds no memory. Running a cell restores it.'
    );
  } else {
    item.removeAttribute('title');
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-ckpt:plugin',
  description:
    'Saved sessions panel, kernel suspend status and checkpoint commands.',
  autoStart: true,
  requires: [IDocumentManager, INotebookTracker],
  optional: [
    ICommandPalette,
    IMainMenu,
    IStatusBar,
    ILabShell,
    ILayoutRestorer,
    ISettingRegistry,
    ITranslator
  ],
  activate
};

export default plugin;
