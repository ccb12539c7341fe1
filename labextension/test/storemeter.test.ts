import { nullTranslator } from '@jupyterlab/translation';
import { describe, expect, it } from 'vitest';

import { meterReading } from '../src/storemeter';

const trans = nullTranslator.load('jupyter_ckpt');
const usage = {
  bytes: 4_000_000,
  images: 3,
  quota_bytes: null,
  disk_bytes: null,
  disk_free_bytes: null
};

describe('meterReading', () => {
  it('reads the use against the quota', () => {
    const reading = meterReading({ ...usage, quota_bytes: 10_000_000 }, trans);
    expect(reading.text).toBe('Store: 4.0 MB / 10.0 MB');
    expect(reading.share).toBeCloseTo(0.4);
    expect(reading.title).toContain('3 images (40%)');
  });

  it('reads the disk of a local store without a quota', () => {
    const reading = meterReading(
      { ...usage, disk_bytes: 100_000_000, disk_free_bytes: 25_000_000 },
      trans
    );
    expect(reading.text).toBe('Store: 4.0 MB · disk 25.0 MB free');
    expect(reading.share).toBeCloseTo(0.75);
  });

  it('has no bar with neither', () => {
    expect(meterReading(usage, trans)).toMatchObject({
      text: 'Store: 4.0 MB',
      share: null
    });
  });
});
