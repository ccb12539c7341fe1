import { LabIcon } from '@jupyterlab/ui-components';

/** A stack of saved layers with a resume arrow. */
const svgstr = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M12 2 2 7l10 5 10-5-10-5zm-8.2 9.1L2 12l10 5 10-5-1.8-.9L12 15z"/>
    <path d="M3.8 16.1 2 17l10 5 4-2v-2.2L12 20z"/>
    <path d="M18 14v8l5-4z"/>
  </g>
</svg>`;

export const ckptIcon = new LabIcon({
  name: 'jupyter-ckpt:saved-sessions',
  svgstr
});

/** A tag outline drawn for 12 px: the stock tag icon, drawn for 16 px and up, blurs
 * into a dot at that size. Marks an image saved under a name of its own. */
const tagSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="12" height="12" viewBox="0 0 12 12">
  <path class="jp-icon3" style="fill: none" stroke="#616161" stroke-width="1.2" stroke-linejoin="round" d="M1 1.6v3.9l5.5 5.5 4.5-4.5L5.5 1H1.6z"/>
  <circle class="jp-icon3" fill="#616161" cx="3.6" cy="3.6" r="1"/>
</svg>`;

export const nameTagIcon = new LabIcon({
  name: 'jupyter-ckpt:name-tag',
  svgstr: tagSvg
});
