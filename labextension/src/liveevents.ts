/** The server's jupyter_ckpt events, followed by the panel and the status item. */

import { Event } from '@jupyterlab/services';
import { ISignal } from '@lumino/signaling';

import { KernelStatusModel } from './kernelstatus';
import { SavedSessionsModel } from './sessions';
import { EVENT_SCHEMA, ICkptEvent } from './types';

/** What the events update: the models, and this page's lists of running kernels. */
export interface ILiveParts {
  kernels: KernelStatusModel;
  sessions: SavedSessionsModel;
  /** Whether this page's kernel list has the kernel. */
  knowsKernel: (kernelId: string) => boolean;
  /** Reload this page's lists of sessions and kernels (JupyterLab's, which it polls
   * every few seconds): they learn at once of a kernel started or shut down elsewhere. */
  refreshRunning: () => Promise<void>;
  /** Tell the user what the event says that they must know, if anything (a restore
   * that failed, the variables it left out on purpose). */
  tell: (event: ICkptEvent) => void;
}

/**
 * Follow the server's events (JupyterLab's `/api/events/subscribe` websocket): what
 * they say is shown at once (a kernel's new state, the store's health, an image's
 * progress), then the image list and the kernels' status are loaded again for the rest.
 * Every tab of every user of the server gets them (jupyter_server sends them to each
 * authorized subscriber), so each is current within a moment of a change anywhere.
 */
export function followEvents(
  stream: ISignal<Event.IManager, Event.Emission>,
  parts: ILiveParts
): void {
  const { kernels, sessions } = parts;
  stream.connect((_, emission) => {
    if (emission.schema_id !== EVENT_SCHEMA) {
      return;
    }
    const event = emission as unknown as ICkptEvent;
    kernels.noteEvent(event);
    if (event.action === 'progress') {
      return; // a few a second while an image moves: nothing to reload yet
    }
    const now = Date.now();
    if (event.action === 'store') {
      kernels.noteStore(event.status !== 'error', event.msg, now);
    }
    const id = event.kernel_id;
    if (event.action === 'state' && id && event.state) {
      kernels.noteState(id, event.state, now);
      sessions.liveChanged();
      if (event.state === 'gone' || !parts.knowsKernel(id)) {
        void parts.refreshRunning().catch(() => undefined);
      }
    }
    void sessions.refresh();
    void kernels.refresh().catch(() => undefined);
    parts.tell(event);
  });
}
