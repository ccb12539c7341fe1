/** The Details view's table: one line per variable of an image. */

import { formatBytes } from './format';
import { IVariable } from './types';

export interface IVariableRow {
  name: string;
  /** The type, and an array's dtype and shape: "numpy.ndarray float32 3 × 4". */
  type: string;
  size: string;
  device: string;
  saved: boolean;
  /** "saved", "imported from numpy", or why it was not saved. */
  note: string;
}

export function variableRows(variables: IVariable[]): IVariableRow[] {
  const rows = variables.map(v => {
    const saved = v.status === 'saved' || v.status === 'imported';
    const note =
      v.status === 'imported'
        ? `imported from ${v.module ?? 'a module'}`
        : saved
          ? 'saved'
          : (v.reason ?? v.status);
    return {
      name: v.name,
      type: [v.type, v.dtype, v.shape && shapeText(v.shape)]
        .filter(Boolean)
        .join(' '),
      size: v.bytes !== undefined ? formatBytes(v.bytes) : '—',
      device: v.devices?.length
        ? v.devices.join(', ')
        : v.status === 'saved'
          ? 'cpu'
          : '—',
      saved,
      note
    };
  });
  // what was not saved first: that is what the reader is looking for
  return rows.sort(
    (a, b) => Number(a.saved) - Number(b.saved) || a.name.localeCompare(b.name)
  );
}

/** "3 × 4", "scalar" for a zero-dimensional array. */
export function shapeText(shape: number[]): string {
  return shape.length ? shape.join(' × ') : 'scalar';
}
