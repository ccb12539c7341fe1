/** One load at a time, and none that predates what its caller asked after. */

/**
 * Runs `load` when asked, never twice at once. A call made while a load runs gets the
 * next load, started once that one ends and shared by every call made meanwhile: the
 * running load may have been answered before the change that prompted the call (an
 * event, a click), so sharing it would keep the change out of view until the next one.
 */
export class Refresher {
  constructor(private readonly _load: () => Promise<void>) {}

  /** Whether a load runs. */
  get busy(): boolean {
    return this._running !== null;
  }

  run(): Promise<void> {
    if (this._running === null) {
      this._running = this._load().finally(() => {
        this._running = null;
      });
      return this._running;
    }
    if (this._next === null) {
      this._next = this._running
        .catch(() => undefined)
        .then(() => {
          this._next = null;
          return this.run();
        });
    }
    return this._next;
  }

  private _running: Promise<void> | null = null;
  private _next: Promise<void> | null = null;
}
