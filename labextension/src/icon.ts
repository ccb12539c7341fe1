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
