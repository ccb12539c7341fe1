/** The panel's sort order and, while images are selected, what can be done with them. */

import { TranslationBundle } from '@jupyterlab/translation';
import { HTMLSelect } from '@jupyterlab/ui-components';
import * as React from 'react';

import { formatBytes } from './format';
import { ListView, SORT_KEYS, SortKey } from './listview';

export function sortLabels(trans: TranslationBundle): Record<SortKey, string> {
  return {
    date: trans.__('Newest first'),
    name: trans.__('Name'),
    size: trans.__('Largest first')
  };
}

/** The toolbar's dropdown of sort orders. */
export function SortSelect({
  view,
  trans
}: {
  view: ListView;
  trans: TranslationBundle;
}): JSX.Element {
  const labels = sortLabels(trans);
  return (
    <HTMLSelect
      className="jp-CkptPanel-sort"
      aria-label={trans.__('Sort saved sessions')}
      title={trans.__('Sort saved sessions')}
      value={view.sortBy}
      onChange={event => (view.sortBy = event.target.value as SortKey)}
      options={SORT_KEYS.map(key => ({ value: key, label: labels[key] }))}
    />
  );
}

/** "3 images selected (1.2 GB)", with Delete and Clear; announced as it changes. */
export function SelectionBar({
  count,
  bytes,
  deleteBlocked,
  onDelete,
  onClear,
  trans
}: {
  count: number;
  bytes: number;
  /** Why the selection cannot be deleted now, or null. */
  deleteBlocked: string | null;
  onDelete: () => void;
  onClear: () => void;
  trans: TranslationBundle;
}): JSX.Element {
  return (
    <div className="jp-CkptPanel-selection">
      <span role="status">
        {count > 0 &&
          trans._n(
            '%1 image selected (%2)',
            '%1 images selected (%2)',
            count,
            formatBytes(bytes)
          )}
      </span>
      {count > 0 && (
        <>
          <button
            className="jp-CkptButton jp-mod-warn"
            onClick={() => !deleteBlocked && onDelete()}
            aria-disabled={deleteBlocked ? 'true' : undefined}
            aria-label={trans.__('Delete selected images')}
            title={deleteBlocked ?? trans.__('Delete the images selected')}
          >
            {trans.__('Delete')}
          </button>
          <button
            className="jp-CkptButton"
            onClick={onClear}
            aria-label={trans.__('Clear selection')}
            title={trans.__('Clear selection (Esc)')}
          >
            {trans.__('Clear')}
          </button>
        </>
      )}
    </div>
  );
}
