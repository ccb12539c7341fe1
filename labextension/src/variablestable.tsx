/** The Details view's content: every variable of an image, saved or not and why. */

import * as React from 'react';

import { exactTime, shortId } from './format';
import { IImageDetails } from './types';
import { variableRows } from './variables';

export function VariablesTable({
  image
}: {
  image: IImageDetails;
}): JSX.Element {
  const rows = variableRows(image.variables);
  const lost = rows.filter(row => !row.saved).length;
  const heading = (
    <>
      Image <code title={image.id}>{shortId(image.id)}</code>
      {image.created && <> saved {exactTime(image.created)}</>}
    </>
  );
  if (rows.length === 0) {
    return (
      <div className="jp-CkptDetails">
        <p>{heading}: no variables (the kernel had none when it was saved).</p>
      </div>
    );
  }
  return (
    <div className="jp-CkptDetails">
      <p>
        {heading}: {rows.length - lost} of {rows.length} variables saved.
      </p>
      <table className="jp-CkptDetails-table">
        <caption className="jp-CkptDetails-caption">
          Variables, those not saved first
        </caption>
        <thead>
          <tr>
            <th scope="col">Name</th>
            <th scope="col">Type</th>
            <th scope="col">Size</th>
            <th scope="col">Device</th>
            <th scope="col">Status</th>
          </tr>
        </thead>
        <tbody>
          {rows.map(row => (
            <tr
              key={row.name}
              className={row.saved ? '' : 'jp-mod-lost'}
              data-variable={row.name}
            >
              <th scope="row">
                <code>{row.name}</code>
              </th>
              <td>{row.type}</td>
              <td>{row.size}</td>
              <td>{row.device}</td>
              <td>{row.saved ? row.note : `not saved: ${row.note}`}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
