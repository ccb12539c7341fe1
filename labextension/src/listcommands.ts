/**
 * The commands on the panel's images: its rows' context menu (Resume, Details, Copy
 * Image ID, Show Notebook in File Browser, Delete, bulk deletes), the keys of the list
 * (Enter, Delete, Ctrl/Cmd+A, Escape: keybindings in the settings schema), and the
 * remembered sort order.
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { Clipboard } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { TranslationBundle } from '@jupyterlab/translation';

import { BulkDelete } from './bulk';
import { KernelStatusModel } from './kernelstatus';
import { isSortKey, ListCommandIDs, whyNotDeletable } from './listview';
import { IRowActions, SavedSessionsPanel } from './panel';
import { groupRows, imageLabel, ISessionRow, rowActions } from './sessions';

/** Where the context menu offers them: on any image's row, the entry's or an older one. */
const ROW_SELECTOR = '.jp-CkptPanel .jp-CkptRow[data-image-id]';

/** The setting that remembers the panel's sort order. */
const SORT_SETTING = 'sortBy';

type Args = { [key: string]: unknown };

export function addListCommands(
  app: JupyterFrontEnd,
  panel: SavedSessionsPanel,
  actions: IRowActions,
  bulk: BulkDelete,
  kernels: KernelStatusModel,
  trans: TranslationBundle
): void {
  const { commands } = app;
  const model = panel.model;
  const selection = panel.view.selection;

  /** The row a command is about: `imageId`, else the row in focus (the keys pass
   * `focused`), else the row the context menu was opened on. */
  const rowOf = (args: Args): ISessionRow | undefined => {
    let id: string | undefined;
    if (typeof args.imageId === 'string') {
      id = args.imageId;
    } else if (args.focused) {
      const active = document.activeElement;
      id = panel.node.contains(active)
        ? active?.closest<HTMLElement>('[data-image-id]')?.dataset.imageId
        : undefined;
    } else {
      id = app.contextMenuHitTest(node => !!node.dataset.imageId)?.dataset
        .imageId;
    }
    return id ? panel.rowOf(id) : undefined;
  };
  const can = (row: ISessionRow | undefined, action: 'resume' | 'details') =>
    !!row && rowActions(row.image).includes(action);
  /** What Delete acts on: the selection, when the row is one of several selected. */
  const targets = (row: ISessionRow | undefined): ISessionRow[] => {
    if (!row) {
      return [];
    }
    if (selection.has(row.image.id) && selection.size > 1) {
      return model.allRows.filter(r => selection.has(r.image.id));
    }
    return [row];
  };
  const storeBlocked = () => kernels.storeProblem;
  const entryOf = (row: ISessionRow) =>
    groupRows(model.allRows).find(
      entry => entry.latest === row || entry.older.includes(row)
    );
  const olderOf = (row: ISessionRow | undefined) =>
    (row && entryOf(row)?.older.filter(r => !whyNotDeletable(r))) ?? [];

  commands.addCommand(ListCommandIDs.open, {
    // without a row (the keyboard shortcuts' list): what it is about, in full
    label: args => {
      const row = rowOf(args);
      return !row
        ? trans.__('Resume Saved Image')
        : row.suspendedKernel
          ? trans.__('Open')
          : trans.__('Resume');
    },
    caption: args =>
      rowOf(args)?.suspendedKernel
        ? trans.__('Open the notebook; running a cell restores its kernel')
        : trans.__(
            'Start a kernel restored from this image and open its notebook'
          ),
    isEnabled: args => can(rowOf(args), 'resume'),
    execute: args => {
      const row = rowOf(args);
      return row ? actions.resume(row) : undefined;
    }
  });
  commands.addCommand(ListCommandIDs.details, {
    label: args =>
      rowOf(args) ? trans.__('Details') : trans.__('Saved Image Details'),
    caption: trans.__(
      "The image's variables, and what changed since the one before"
    ),
    isEnabled: args => can(rowOf(args), 'details'),
    execute: args => {
      const row = rowOf(args);
      return row ? actions.details(row) : undefined;
    }
  });
  commands.addCommand(ListCommandIDs.copyId, {
    label: trans.__('Copy Image ID'),
    caption: trans.__(
      'Copy the full id of the image, which `%ckpt restore` and `jupyter ckpt` take'
    ),
    isEnabled: args => !!rowOf(args),
    execute: args => {
      const row = rowOf(args);
      if (row) {
        Clipboard.copyToSystem(row.image.id);
      }
    }
  });
  /** Why the row's notebook cannot be shown, or null. */
  const noNotebook = (row: ISessionRow | undefined): string | null =>
    !row
      ? trans.__('no image')
      : !row.notebook
        ? trans.__('no notebook: a console wrote it')
        : row.notebookGone
          ? trans.__('the notebook was deleted')
          : null;
  commands.addCommand(ListCommandIDs.showNotebook, {
    label: args => {
      const why = noNotebook(rowOf(args));
      return why
        ? trans.__('Show Notebook in File Browser (%1)', why)
        : trans.__('Show Notebook in File Browser');
    },
    caption: args => {
      const row = rowOf(args);
      return noNotebook(row) === null
        ? trans.__('Open the file browser at %1', row?.notebook ?? '')
        : trans.__(
            'Its notebook file is gone, or it has none: resume it to choose one'
          );
    },
    isEnabled: args => noNotebook(rowOf(args)) === null,
    execute: args => {
      const path = rowOf(args)?.notebook;
      return path
        ? commands.execute('filebrowser:go-to-path', { path })
        : undefined;
    }
  });
  commands.addCommand(ListCommandIDs.remove, {
    label: args => {
      const count = targets(rowOf(args)).length;
      return count > 1
        ? trans.__('Delete %1 Selected Images', count)
        : count
          ? trans.__('Delete')
          : trans.__('Delete Saved Image');
    },
    caption: args => {
      const chosen = targets(rowOf(args));
      const problem = storeBlocked();
      if (problem) {
        return trans.__(
          'The store cannot be written now, so no image can be deleted: %1',
          problem
        );
      }
      return chosen.length === 1
        ? (whyNotDeletable(chosen[0]) ??
            trans.__('Delete image %1', imageLabel(chosen[0].image)))
        : trans.__('Delete the images selected');
    },
    isEnabled: args => {
      const chosen = targets(rowOf(args));
      return (
        !storeBlocked() &&
        chosen.length > 0 &&
        (chosen.length > 1 || !whyNotDeletable(chosen[0]))
      );
    },
    execute: args => {
      const chosen = targets(rowOf(args));
      if (chosen.length > 1) {
        return bulk.delete(chosen);
      }
      return chosen.length ? actions.remove(chosen[0]) : undefined;
    }
  });
  commands.addCommand(ListCommandIDs.removeOlder, {
    label: args => {
      const row = rowOf(args);
      return row
        ? trans.__('Delete Older Images of %1', row.title)
        : trans.__('Delete Older Images');
    },
    caption: trans.__(
      "Delete the entry's images but its newest (or its suspended kernel's)"
    ),
    isEnabled: args => !storeBlocked() && olderOf(rowOf(args)).length > 0,
    execute: args => bulk.delete(olderOf(rowOf(args)))
  });
  commands.addCommand(ListCommandIDs.removeBefore, {
    label: trans.__('Delete Images Older Than…'),
    caption: trans.__(
      'Delete the images the list shows that were saved before a date'
    ),
    isEnabled: () => !storeBlocked() && model.rows.length > 0,
    execute: () => bulk.deleteBefore(model.rows)
  });
  commands.addCommand(ListCommandIDs.selectAll, {
    label: trans.__('Select All Images'),
    caption: trans.__('Select every image the list shows, older ones included'),
    execute: () => selection.selectAll(model.rows.map(row => row.image.id))
  });
  commands.addCommand(ListCommandIDs.clearSelection, {
    label: trans.__('Clear Image Selection'),
    execute: () => selection.clear()
  });
  // the store's health and the selection change what Delete says and allows
  kernels.changed.connect(() => commands.notifyCommandChanged());
  panel.view.changed.connect(() => commands.notifyCommandChanged());

  const items: [string, number][] = [
    [ListCommandIDs.open, 0],
    [ListCommandIDs.details, 2],
    [ListCommandIDs.copyId, 3],
    [ListCommandIDs.showNotebook, 4],
    [ListCommandIDs.remove, 6],
    [ListCommandIDs.removeOlder, 7],
    [ListCommandIDs.removeBefore, 8]
  ];
  for (const [command, rank] of items) {
    app.contextMenu.addItem({ command, selector: ROW_SELECTOR, rank });
  }
  app.contextMenu.addItem({
    type: 'separator',
    selector: ROW_SELECTOR,
    rank: 5
  });
}

/** Remember the sort order in the extension's settings; follow changes made in the
 * settings editor. */
export function rememberSort(
  panel: SavedSessionsPanel,
  settings: ISettingRegistry.ISettings
): void {
  const view = panel.view;
  const read = () => {
    const key = settings.get(SORT_SETTING).composite;
    if (isSortKey(key)) {
      view.sortBy = key;
    }
  };
  read();
  settings.changed.connect(read);
  view.changed.connect(() => {
    if (settings.get(SORT_SETTING).composite !== view.sortBy) {
      void settings.set(SORT_SETTING, view.sortBy);
    }
  });
}
