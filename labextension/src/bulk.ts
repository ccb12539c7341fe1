/** Deleting many images at once: one confirmation, one summary. */

import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { ICkptSettings } from './actions';
import { formatBytes, shortReason } from './format';
import {
  deletable,
  imageBytes,
  savedBefore,
  whyNotDeletable
} from './listview';
import {
  imageLabel,
  ISessionRow,
  refusalText,
  SavedSessionsModel
} from './sessions';
import { ICkptApi } from './types';

/** How long the summary of a bulk delete that all went well stays. */
const SUCCESS_MS = 5000;

/** How many days back "Delete Images Older Than…" proposes. */
const DEFAULT_AGE_DAYS = 30;

/**
 * Deletes the images of several rows through the server's DELETE route, one request
 * at a time (the REST API deletes one image per request). Images a kernel needs are
 * left alone, as a single Delete leaves them: the confirmation says how many.
 */
export class BulkDelete {
  constructor(
    private readonly _api: Pick<ICkptApi, 'deleteImage'>,
    private readonly _sessions: SavedSessionsModel,
    private readonly _trans: TranslationBundle,
    private readonly _settings: () => ICkptSettings
  ) {}

  /** Delete the rows' images after one confirmation naming how many and their size;
   * then one summary. */
  async delete(rows: readonly ISessionRow[]): Promise<void> {
    const trans = this._trans;
    const { remove, keep } = deletable(rows, whyNotDeletable);
    if (remove.length === 0) {
      Notification.info(trans.__('Nothing deleted. %1', this._keptText(keep)), {
        autoClose: SUCCESS_MS
      });
      return;
    }
    const size = formatBytes(remove.reduce((s, r) => s + imageBytes(r), 0));
    if (
      this._settings().confirmDelete &&
      !(await this._confirm(remove, size, keep))
    ) {
      return;
    }
    const failed: [ISessionRow, string][] = [];
    let deleted = 0;
    let queue = Promise.resolve();
    // every row shows busy at once; the requests go one after the other
    await Promise.all(
      remove.map(row =>
        this._sessions.act(row.image.id, () => {
          this._sessions.clearNote(row.image.id);
          queue = queue.then(() =>
            this._api.deleteImage(row.image.id).then(
              () => void deleted++,
              error => {
                const why = refusalText(
                  error instanceof Error ? error.message : String(error)
                );
                failed.push([row, why]);
                this._sessions.note(
                  row.image.id,
                  trans.__(
                    'Image %1 not deleted: %2',
                    imageLabel(row.image),
                    why
                  )
                );
              }
            )
          );
          return queue;
        })
      )
    );
    // a list loading now was asked for by the events of the first deletes and may
    // still show the last ones: wait for it, then load once more
    await this._sessions.refresh();
    await this._sessions.refresh();
    this._summary(deleted, size, failed);
  }

  /** Ask for a date, then delete the images of `rows` saved before it. */
  async deleteBefore(rows: readonly ISessionRow[]): Promise<void> {
    const trans = this._trans;
    const body = new DateBody(
      trans.__('Delete the images the list shows that were saved before:'),
      trans.__('Saved before')
    );
    const result = await showDialog({
      title: trans.__('Delete Images Older Than…'),
      body,
      buttons: [
        Dialog.cancelButton({ label: trans.__('Cancel') }),
        Dialog.warnButton({ label: trans.__('Continue') })
      ],
      focusNodeSelector: 'input'
    });
    if (!result.button.accept) {
      return;
    }
    const old = savedBefore(rows, result.value ?? '');
    if (old === null) {
      Notification.error(trans.__('Nothing deleted: no date was given.'), {
        autoClose: SUCCESS_MS
      });
    } else if (old.length === 0) {
      Notification.info(
        trans.__('No image shown was saved before %1.', result.value ?? ''),
        { autoClose: SUCCESS_MS }
      );
    } else {
      await this.delete(old);
    }
  }

  private async _confirm(
    remove: ISessionRow[],
    size: string,
    keep: ISessionRow[]
  ): Promise<boolean> {
    const trans = this._trans;
    const notebooks = new Set(remove.map(row => row.title)).size;
    const lines = [
      notebooks > 1
        ? trans.__(
            'Delete %1 images (%2) of %3 saved sessions?',
            remove.length,
            size,
            notebooks
          )
        : trans._n(
            'Delete %1 image (%2) of %3?',
            'Delete %1 images (%2) of %3?',
            remove.length,
            size,
            remove[0].title
          ),
      trans.__(
        'Their variables cannot be restored afterwards. Notebook files are not changed.'
      )
    ];
    if (keep.length) {
      lines.push(this._keptText(keep));
    }
    const result = await showDialog({
      title: trans._n(
        'Delete %1 Saved Image?',
        'Delete %1 Saved Images?',
        remove.length
      ),
      body: lines.join(' '),
      buttons: [
        Dialog.cancelButton({ label: trans.__('Cancel') }),
        Dialog.warnButton({
          label: trans._n('Delete %1 image', 'Delete %1 images', remove.length)
        })
      ]
    });
    return result.button.accept;
  }

  /** Why some of the images asked for are not deleted: a kernel needs them (as their
   * own Delete says), or they cannot be verified (and have no Delete). */
  private _keptText(keep: readonly ISessionRow[]): string {
    const trans = this._trans;
    const unverified = keep.filter(row => row.image.state === 'invalid').length;
    const needed = keep.length - unverified;
    const parts: string[] = [];
    if (needed) {
      parts.push(
        trans._n(
          '%1 image is kept: a kernel needs it.',
          '%1 images are kept: kernels need them.',
          needed
        )
      );
    }
    if (unverified) {
      parts.push(
        trans._n(
          '%1 image that cannot be verified is kept.',
          '%1 images that cannot be verified are kept.',
          unverified
        )
      );
    }
    return parts.join(' ');
  }

  /** One notification for the whole delete: how many went, and why any did not. */
  private _summary(
    deleted: number,
    size: string,
    failed: [ISessionRow, string][]
  ): void {
    const trans = this._trans;
    if (failed.length === 0) {
      const count = deleted;
      if (this._settings().successNotifications) {
        Notification.success(
          trans._n(
            'Deleted %1 image (%2).',
            'Deleted %1 images (%2).',
            count,
            size
          ),
          { autoClose: SUCCESS_MS }
        );
      }
      return;
    }
    const message = trans.__(
      'Deleted %1 of %2 images; %3 not deleted: %4.',
      deleted,
      deleted + failed.length,
      failed.length,
      shortReason(failed[0][1])
    );
    Notification.error(message, {
      autoClose: false,
      actions: [
        {
          label: trans.__('Show details'),
          callback: event => {
            event.preventDefault(); // the notification stays until the user acts
            const list = document.createElement('ul');
            for (const [row, why] of failed) {
              const item = document.createElement('li');
              item.textContent = `${row.title}, ${imageLabel(row.image)}: ${why}`;
              list.appendChild(item);
            }
            void showDialog({
              title: trans.__('Images Not Deleted'),
              body: new Widget({ node: list }),
              buttons: [Dialog.okButton({ label: trans.__('Close') })]
            });
          }
        }
      ]
    });
  }
}

/** A dialog body with a date input, a given number of days back at first. */
class DateBody extends Widget implements Dialog.IBodyWidget<string> {
  constructor(text: string, label: string) {
    super();
    const intro = document.createElement('p');
    intro.textContent = text;
    this._input.type = 'date';
    this._input.className = 'jp-mod-styled';
    this._input.setAttribute('aria-label', label);
    const start = new Date(Date.now() - DEFAULT_AGE_DAYS * 86400 * 1000);
    this._input.value = [
      start.getFullYear(),
      String(start.getMonth() + 1).padStart(2, '0'),
      String(start.getDate()).padStart(2, '0')
    ].join('-');
    this.node.append(intro, this._input);
  }

  getValue(): string {
    return this._input.value;
  }

  private readonly _input = document.createElement('input');
}
