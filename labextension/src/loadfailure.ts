/**
 * Why the panel could not load its list, in one short sentence that says which part
 * failed (the Jupyter server, the extension, the image store), and the whole message
 * for *Show details*.
 */

import { ServerConnection } from '@jupyterlab/services';
import { TranslationBundle } from '@jupyterlab/translation';

import { shortReason } from './format';

export interface ILoadFailure {
  /** One short sentence: what failed, no URL, path or errno. */
  lead: string;
  /** Everything the browser or the server said, with its advice. */
  details: string;
}

export function loadFailure(
  reason: unknown,
  trans: TranslationBundle
): ILoadFailure {
  const message = reason instanceof Error ? reason.message : String(reason);
  if (reason instanceof ServerConnection.NetworkError) {
    return {
      lead: trans.__(
        'The Jupyter server does not answer: it may have stopped, or the network is down.'
      ),
      details: message
    };
  }
  const status =
    reason instanceof ServerConnection.ResponseError
      ? reason.response.status
      : null;
  if (status === 404) {
    return {
      lead: trans.__('This server has no jupyter-ckpt extension enabled.'),
      details: trans.__(
        '%1\n\nCheck that `jupyter server extension list` shows jupyter_ckpt_server enabled, then restart the server.',
        message
      )
    };
  }
  if (status === 503) {
    // the server runs; its image store does not answer, or refuses it
    return {
      lead: trans.__(
        'The server cannot use its image store: %1.',
        shortReason(message)
      ),
      details: message
    };
  }
  if (status === 403) {
    return {
      lead: trans.__('You are not allowed to see the saved sessions here.'),
      details: message
    };
  }
  return {
    lead: trans.__(
      'The server could not list the saved sessions: %1.',
      shortReason(message)
    ),
    details: message
  };
}
