/** A mark on suspended kernels in JupyterLab's Running panel. */

import { KernelStatusModel } from './kernelstatus';

/** The Kernels section's kernel items; each carries its kernel's id in
 * `data-context`, which JupyterLab's running extension sets for its context menu. */
const KERNEL_ITEM = '.jp-RunningSessions-item.jp-mod-kernel[data-context]';

/**
 * Mark the kernel items of the Running panel (`root`) whose kernel is suspended: a
 * "Suspended" tag before the name (`mark`, shown by the stylesheet) and, for screen
 * readers, `description`. JupyterLab draws these items from its kernel list, which
 * knows no suspension, and lets an extension add a section of its own to the panel but
 * not decorate the items of another; so each item is marked by the kernel id it
 * carries, again whenever the panel redraws or a kernel's state changes. Returns a
 * function that stops it.
 */
export function markRunningKernels(
  root: HTMLElement,
  kernels: KernelStatusModel,
  mark: string,
  description: string
): () => void {
  const apply = () => {
    root.querySelectorAll<HTMLElement>(KERNEL_ITEM).forEach(item => {
      const suspended = kernels.isSuspended(item.dataset.context ?? '');
      // its name, which the panel may draw anew: the tag is drawn before it
      const label = item.querySelector<HTMLElement>(
        ':scope > .jp-RunningSessions-itemLabel'
      );
      if (suspended) {
        item.dataset.ckptState = 'suspended';
        item.setAttribute('aria-description', description);
        if (label && label.dataset.ckptMark !== mark) {
          label.dataset.ckptMark = mark;
        }
      } else if (item.dataset.ckptState) {
        delete item.dataset.ckptState;
        item.removeAttribute('aria-description');
        delete label?.dataset.ckptMark;
      }
    });
  };
  // the panel redraws its items when JupyterLab's lists change: only added nodes matter
  const observer = new MutationObserver(apply);
  observer.observe(root, { childList: true, subtree: true });
  kernels.changed.connect(apply);
  apply();
  return () => {
    observer.disconnect();
    kernels.changed.disconnect(apply);
  };
}
