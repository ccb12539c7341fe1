/** What changed from the image saved before to this one, for the Details view. */

import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { shortId } from './format';
import { variableDiff } from './sessions';
import { IImageDetails } from './types';

/** The variables added, removed and changed since `previous`; "nothing changed" when
 * the manifests show no difference; a line saying it is the first without one. */
export function ImageChanges({
  image,
  previous,
  trans
}: {
  image: IImageDetails;
  previous: IImageDetails | null;
  trans: TranslationBundle;
}): JSX.Element {
  if (!previous) {
    return (
      <p className="jp-CkptDetails-since">
        {trans.__('The first image of this session: nothing to compare with.')}
      </p>
    );
  }
  const diff = variableDiff(image.variables, previous.variables);
  const since = (
    <code title={previous.id}>
      {previous.name
        ? `${previous.name} (${shortId(previous.id)})`
        : shortId(previous.id)}
    </code>
  );
  const lines: [keyof typeof diff, string][] = [
    ['added', trans.__('Added:')],
    ['removed', trans.__('Removed:')],
    ['changed', trans.__('Changed:')]
  ];
  const shown = lines.filter(([key]) => diff[key].length);
  return (
    <div className="jp-CkptDetails-diff">
      <p className="jp-CkptDetails-since">
        {trans.__('Since the image before it,')} {since}
        {shown.length
          ? ':'
          : `: ${trans.__('no variable added, removed or changed.')}`}
      </p>
      {shown.length > 0 && (
        <ul className="jp-CkptDetails-changes">
          {shown.map(([key, label]) => (
            <li key={key} data-change={key}>
              {label}{' '}
              {diff[key].map((name, i) => (
                <React.Fragment key={name}>
                  {i > 0 && ', '}
                  <code>{name}</code>
                </React.Fragment>
              ))}
            </li>
          ))}
        </ul>
      )}
    </div>
  );
}
