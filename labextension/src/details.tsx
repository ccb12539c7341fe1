/** The Details dialog: every variable of an image, saved or not and why. */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { exactTime } from './format';
import { IImageDetails } from './types';
import { variableRows } from './variables';

function VariablesTable({ image }: { image: IImageDetails }): JSX.Element {
  const rows = variableRows(image.variables);
  const lost = rows.filter(row => !row.saved).length;
  return (
    <div className="jp-CkptDetails">
      <p>
        Image <code>{image.id}</code>
        {image.created && <> saved {exactTime(image.created)}</>}:{' '}
        {rows.length - lost} of {rows.length} variables saved.
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

export async function showDetails(
  title: string,
  image: IImageDetails
): Promise<void> {
  await showDialog({
    title: `Details of ${title}`,
    body: ReactWidget.create(<VariablesTable image={image} />),
    buttons: [Dialog.okButton({ label: 'Close' })]
  });
}
