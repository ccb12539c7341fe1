/** Small parts of a saved-sessions entry, rendered from the server's data alone. */

import * as React from 'react';

import { recoveredTitle } from './kernelstatus';
import { IKernelStatus } from './types';

/** "recovered after a crash" on the entry of a kernel its server did not suspend. */
export function RecoveredBadge({
  status
}: {
  status: IKernelStatus | undefined;
}): JSX.Element | null {
  const title = recoveredTitle(status);
  return title ? (
    <span className="jp-CkptBadge jp-mod-recovered" title={title}>
      recovered after a crash
    </span>
  ) : null;
}
