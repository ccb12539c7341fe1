/** The Details dialog: every variable of an image, saved or not and why, and what
 * changed since the image saved before it in the same entry. */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import { ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { ImageChanges } from './imagechanges';
import { IImageDetails } from './types';
import { VariablesTable } from './variablestable';

export async function showDetails(
  title: string,
  image: IImageDetails,
  previous: IImageDetails | null,
  trans: TranslationBundle
): Promise<void> {
  await showDialog({
    title: trans.__('Details of %1', title),
    body: ReactWidget.create(
      <>
        <ImageChanges image={image} previous={previous} trans={trans} />
        <VariablesTable image={image} />
      </>
    ),
    buttons: [Dialog.okButton({ label: trans.__('Close') })]
  });
}
