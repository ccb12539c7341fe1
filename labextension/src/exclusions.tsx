/**
 * Variables left out of a kernel's saved state on purpose (*Exclude them*, *Suspend
 * anyway*, `%ckpt exclude`): what the user reads about them after a restore, the line
 * an image's entry shows, and the way back (`%ckpt include`).
 */

import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { nameList } from './kernelstatus';

/** The `%ckpt include` line that saves the variables again from the next image on, run
 * in the kernel (the extension loaded first: it may not be yet). */
export function includeCode(names: readonly string[]): string {
  return `%load_ext jupyter_ckpt\n%ckpt include ${names.join(' ')}`;
}

/** "Run In [3] again to make gen, In [5] for sock.": the cells that make the variables,
 * where the kernel's history names them; else a plain "Run the cells that made them
 * again." */
export function rerunHint(
  names: readonly string[],
  cells: Readonly<Record<string, number>>,
  trans: TranslationBundle
): string {
  const byCell = new Map<number, string[]>();
  for (const name of names) {
    const cell = cells[name];
    if (cell !== undefined) {
      byCell.set(cell, [...(byCell.get(cell) ?? []), name]);
    }
  }
  if (byCell.size === 0) {
    return names.length === 1
      ? trans.__('Run the cell that made it again to have it back.')
      : trans.__('Run the cells that made them again to have them back.');
  }
  const parts = [...byCell]
    .sort(([a], [b]) => a - b)
    .map(([cell, made]) => trans.__('In [%1] for %2', cell, nameList(made)));
  return names.length === 1
    ? trans.__('To have it back, run again: %1.', parts.join('; '))
    : trans.__('To have them back, run again: %1.', parts.join('; '));
}

/** The notification after a restore that left variables out on purpose. */
export function leftOutNotice(
  names: readonly string[],
  cells: Readonly<Record<string, number>>,
  trans: TranslationBundle
): string {
  return `${trans.__(
    'The kernel was restored without %1, left out of its saved state.',
    nameList(names)
  )} ${rerunHint(names, cells, trans)}`;
}

/** An image's "Left out: gen, sock" line; with `onInclude` (its kernel runs), a button
 * that has the kernel save them again. `label` names the entry in the button's
 * accessible name, which must be unique on the page. */
export function LeftOutLine(props: {
  names: readonly string[] | undefined;
  label: string;
  onInclude: (() => Promise<boolean>) | null;
  tabIndex: number;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { names, label, onInclude, tabIndex, trans } = props;
  const [included, setIncluded] = React.useState(false);
  const [busy, setBusy] = React.useState(false);
  if (!names?.length) {
    return null;
  }
  const include = async () => {
    setBusy(true);
    try {
      setIncluded(await onInclude!());
    } finally {
      setBusy(false);
    }
  };
  return (
    <p
      className="jp-CkptRow-leftOut"
      title={trans.__(
        'Left out of the saved state on purpose (Exclude, Suspend anyway or %ckpt exclude): a kernel restored from this image does not have them.'
      )}
    >
      <span className="jp-CkptRow-problemLabel">{trans.__('Left out:')}</span>{' '}
      {names.join(', ')}
      {included ? (
        <span className="jp-CkptRow-included">
          {' '}
          {trans.__('(saved again from the next save on)')}
        </span>
      ) : (
        onInclude && (
          <button
            type="button"
            className="jp-CkptRow-include jp-mod-styled jp-mod-reject"
            aria-label={trans.__('Save %1 again in %2', nameList(names), label)}
            title={trans.__(
              "Save %1 in the kernel's images again from its next save on (%ckpt include)",
              nameList(names)
            )}
            tabIndex={tabIndex}
            disabled={busy}
            onClick={() => void include()}
          >
            {trans.__('Save again')}
          </button>
        )
      )}
    </p>
  );
}
