/** The Details dialog: every variable of an image, saved or not and why. */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { IImageDetails } from './types';
import { VariablesTable } from './variablestable';

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
