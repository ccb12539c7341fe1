import { describe, expect, it } from 'vitest';

import { shapeText, variableRows } from '../src/variables';

describe('variableRows', () => {
  it('lists what was not saved first, with the reason', () => {
    const rows = variableRows([
      { name: 'x', type: 'int', status: 'saved', bytes: 28, devices: [] },
      {
        name: 't',
        type: 'torch.Tensor',
        status: 'saved',
        bytes: 4_000_000,
        devices: ['cuda:0'],
        shape: [1000, 1000],
        dtype: 'torch.float32'
      },
      {
        name: 'fh',
        type: '_io.TextIOWrapper',
        status: 'lost',
        reason: "TypeError: cannot pickle 'TextIOWrapper'"
      },
      { name: 'np', type: 'module', status: 'imported', module: 'numpy' },
      {
        name: 'tmp',
        type: 'list',
        status: 'excluded',
        reason: 'excluded with %ckpt exclude'
      }
    ]);
    expect(rows.map(r => r.name)).toEqual(['fh', 'tmp', 'np', 't', 'x']);
    expect(rows[0]).toMatchObject({
      saved: false,
      size: '—',
      device: '—',
      note: "TypeError: cannot pickle 'TextIOWrapper'"
    });
    expect(rows[2]).toMatchObject({
      saved: true,
      device: '—',
      note: 'imported from numpy'
    });
    expect(rows[4]).toMatchObject({ size: '28 B', device: 'cpu' });
    expect(rows[4].type).toBe('int');
    expect(rows[3]).toMatchObject({
      type: 'torch.Tensor torch.float32 1000 × 1000',
      size: '4.0 MB',
      device: 'cuda:0',
      note: 'saved'
    });
  });
});

describe('shapeText', () => {
  it('writes dimensions the way people say them', () => {
    expect(shapeText([3, 4])).toBe('3 × 4');
    expect(shapeText([])).toBe('scalar');
  });
});
