/** The status bar item for the current notebook's kernel. */

import { ISessionContext } from '@jupyterlab/apputils';
import { ReactWidget } from '@jupyterlab/ui-components';
import { Kernel } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';
import * as React from 'react';

import { shortReason } from './format';
import {
  endsWithoutMessage,
  KernelStatusModel,
  ICommFields,
  wakesKernel
} from './kernelstatus';

/** Seconds between status fetches while the kernel works in the background. */
const BACKGROUND_POLL = 5;
/** How long to wait before asking again when the server has not yet seen the kernel idle. */
const RECHECK_MS = 1000;

export class KernelStatusItem extends ReactWidget {
  constructor(
    private readonly _model: KernelStatusModel,
    private readonly _onClick: () => void
  ) {
    super();
    this.addClass('jp-CkptStatus');
    _model.changed.connect(this.update, this);
    // the countdown and the restore timer move without asking the server
    this._timer = window.setInterval(() => this._onTimer(), 1000);
  }

  /** Follow the kernel of this session (the current notebook's), or none. */
  set session(session: ISessionContext | null) {
    this._session?.kernelChanged.disconnect(this._onKernelChanged, this);
    this._session = session;
    session?.kernelChanged.connect(this._onKernelChanged, this);
    this._watch(session?.session?.kernel ?? null);
  }

  get kernelId(): string | null {
    return this._kernel?.id ?? null;
  }

  /** The status bar shows the item only while it follows a kernel. */
  get activeStateChanged(): ISignal<this, void> {
    return this._activeStateChanged;
  }

  dispose(): void {
    window.clearInterval(this._timer);
    super.dispose();
  }

  render(): JSX.Element | null {
    const kernel = this._kernel;
    const status = kernel
      ? this._model.describe(
          kernel.id,
          Date.now(),
          kernel.status === 'idle' || kernel.status === 'busy'
        )
      : null;
    if (!status) {
      return null;
    }
    const problem = this._model.storeProblem;
    const button = (
      <button
        className={`jp-CkptStatus-button jp-mod-${status.state}`}
        title={`${status.title} Click to show saved sessions.`}
        aria-label={`Kernel checkpoint status: ${status.text}. ${status.title}`}
        onClick={this._onClick}
      >
        {status.text}
      </button>
    );
    return problem ? (
      <>
        <span className="jp-CkptStatus-store" role="alert" title={problem}>
          {shortReason(problem)}
        </span>
        {button}
      </>
    ) : (
      button
    );
  }

  private _onTimer(): void {
    if (!this.isVisible) {
      return;
    }
    this.update();
    // background work ends without a kernel message: ask the server again now and then
    const id = this._kernel?.id;
    if (
      id &&
      endsWithoutMessage(this._model.kernel(id)) &&
      ++this._ticks % BACKGROUND_POLL === 0
    ) {
      void this._model.refresh().catch(() => undefined);
    }
  }

  private _onKernelChanged(
    _: ISessionContext,
    change: { newValue: Kernel.IKernelConnection | null }
  ): void {
    this._watch(change.newValue);
  }

  private _watch(kernel: Kernel.IKernelConnection | null): void {
    this._kernel?.statusChanged.disconnect(this._onStatus, this);
    this._kernel?.anyMessage.disconnect(this._onMessage, this);
    this._kernel = kernel;
    kernel?.statusChanged.connect(this._onStatus, this);
    kernel?.anyMessage.connect(this._onMessage, this);
    this._activeStateChanged.emit();
    this.update();
    void this._model.refresh().catch(() => undefined);
  }

  /** Idle again after work: the idle clock restarted on the server. */
  private _onStatus(_: Kernel.IKernelConnection, status: Kernel.Status): void {
    if (status === 'idle') {
      void this._model.refresh().catch(() => undefined);
    }
  }

  /** A cell this client ran is done, and what kept the kernel from being suspended may
   * be gone with it (a variable deleted): ask the server about this kernel now. Not on
   * every idle status: the server's own checks of the kernel make it busy and idle too. */
  private async _recheck(id: string): Promise<void> {
    await this._model.refresh(id).catch(() => undefined);
    // the server reads the kernel's status on a socket of its own, which may lag ours
    if (this._model.kernel(id)?.execution_state === 'busy') {
      window.setTimeout(
        () => void this._model.refresh(id).catch(() => undefined),
        RECHECK_MS
      );
    }
  }

  /** A request that needs the kernel restores a suspended one (DESIGN section 4). */
  private _onMessage(
    kernel: Kernel.IKernelConnection,
    args: Kernel.IAnyMessageArgs
  ): void {
    const { channel, header, content } = args.msg;
    if (
      args.direction === 'send' &&
      wakesKernel(
        channel,
        header.msg_type,
        content as ICommFields,
        this._probes
      )
    ) {
      this._model.markRestoring(kernel.id, Date.now());
    } else if (
      args.direction === 'recv' &&
      channel === 'shell' &&
      header.msg_type === 'execute_reply'
    ) {
      void this._recheck(kernel.id);
    }
  }

  private _session: ISessionContext | null = null;
  private _kernel: Kernel.IKernelConnection | null = null;
  // ids of the probe comms this client opened (see wakesKernel)
  private _probes = new Set<string>();
  private _timer: number;
  private _ticks = 0;
  private _activeStateChanged = new Signal<this, void>(this);
}
