/** Small parts of a saved-sessions entry, rendered from the server's data alone. */

import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatBytes } from './format';
import { progressText, recoveredTitle } from './kernelstatus';
import {
  ICompatibility,
  IKernelStatus,
  ImageTrigger,
  IProgress,
  Verdict
} from './types';

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

const VERDICT_LABEL: Record<Exclude<Verdict, 'compatible'>, string> = {
  warnings: 'Compatible with warnings',
  incompatible: 'Incompatible'
};

/** Whether the image restores here: nothing when it does without a doubt, otherwise a
 * badge and the reasons, inline. */
export function Compatibility({
  compat,
  id
}: {
  compat: ICompatibility | undefined;
  id: string;
}): JSX.Element | null {
  if (!compat || compat.verdict === 'compatible') {
    return null;
  }
  const reasonsId = `jp-CkptRow-reasons-${id}`;
  return (
    <div className="jp-CkptRow-compat">
      <span
        className={`jp-CkptBadge jp-mod-${compat.verdict}`}
        aria-describedby={compat.reasons.length ? reasonsId : undefined}
      >
        {VERDICT_LABEL[compat.verdict]}
      </span>
      {compat.reasons.length > 0 && (
        <ul className="jp-CkptRow-reasons" id={reasonsId}>
          {compat.reasons.map(reason => (
            <li key={reason}>{reason}</li>
          ))}
        </ul>
      )}
    </div>
  );
}

/** The GPU an image needs to come back: "needs a GPU (NVIDIA A100, 12.3 GB)". `model`
 * is the GPU it was saved from, else the devices its tensors were on; `memory` the
 * bytes they held there. */
export function gpuNeed(
  model: string | undefined,
  memory: number | undefined
): string | null {
  if (!model && !memory) {
    return null;
  }
  const parts = [model, memory ? formatBytes(memory) : null].filter(Boolean);
  return `needs a GPU (${parts.join(', ')})`;
}

/** How far the entry's image is written or read: a bar and "Restoring · 1.2 GB of 4.0 GB". */
export function ProgressLine({
  progress
}: {
  progress: IProgress | undefined;
}): JSX.Element | null {
  if (!progress) {
    return null;
  }
  const label = progressText(progress);
  return (
    <div className="jp-CkptRow-progress" role="status">
      <progress
        value={progress.done}
        max={progress.total || undefined}
        aria-label={label}
      />
      <span>{label}</span>
    </div>
  );
}

/** What an image's trigger is called in its row, and what its tooltip says. */
export function triggerText(
  trigger: ImageTrigger | null | undefined,
  trans: TranslationBundle
): { label: string; title: string } | null {
  switch (trigger) {
    case 'autosave':
      return {
        label: trans.__('autosave'),
        title: trans.__('Written in the background while the kernel ran')
      };
    case 'idle':
      return {
        label: trans.__('idle'),
        title: trans.__('Written when the idle kernel was suspended')
      };
    case 'manual':
      return {
        label: trans.__('manual'),
        title: trans.__('Written when you saved or suspended the kernel')
      };
    case 'shutdown':
      return {
        label: trans.__('shutdown'),
        title: trans.__('Written when the server stopped')
      };
    case 'replaced':
      return {
        label: trans.__('replaced'),
        title: trans.__(
          'Written before another image was resumed into its notebook'
        )
      };
    default:
      return null;
  }
}

/** The trigger an image was written by, as one of its row's facts. */
export function TriggerFact({
  trigger,
  trans
}: {
  trigger: ImageTrigger | null | undefined;
  trans: TranslationBundle;
}): JSX.Element | null {
  const text = triggerText(trigger, trans);
  return text ? (
    <span
      className="jp-CkptRow-trigger"
      data-trigger={trigger}
      title={text.title}
    >
      {text.label}
    </span>
  ) : null;
}

/** "in use by Console 3": the sessions whose kernels run from the image. */
export function InUseLine({
  names,
  trans
}: {
  names: string[];
  trans: TranslationBundle;
}): JSX.Element | null {
  if (!names.length) {
    return null;
  }
  return (
    <div
      className="jp-CkptRow-inUse"
      title={trans.__(
        'The kernel of %1 runs from this image: it was restored from it, or last saved to it',
        names.join(', ')
      )}
    >
      {trans.__('in use by %1', names.join(', '))}
    </div>
  );
}
