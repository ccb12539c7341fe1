import { describe, expect, it } from 'vitest';

import {
  baseName,
  formatBytes,
  formatDuration,
  relativeTime,
  shortenIds,
  shortReason
} from '../src/format';

describe('formatBytes', () => {
  it('uses decimal units with one decimal below 100', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(999)).toBe('999 B');
    expect(formatBytes(12_300_000_000)).toBe('12.3 GB');
    expect(formatBytes(512_000_000)).toBe('512 MB');
  });
});

describe('formatDuration', () => {
  it('picks the coarsest useful unit', () => {
    expect(formatDuration(-3)).toBe('0 s');
    expect(formatDuration(45)).toBe('45 s');
    expect(formatDuration(14 * 60 + 10)).toBe('14 min');
    expect(formatDuration(3 * 3600)).toBe('3 h');
    expect(formatDuration(72 * 3600)).toBe('3 d');
  });
});

describe('relativeTime', () => {
  const now = Date.parse('2026-11-29T12:00:00Z');
  it('says how long ago', () => {
    expect(relativeTime('2026-11-29T11:55:00Z', now)).toBe('5 min ago');
    expect(relativeTime('2026-11-29T11:59:50Z', now)).toBe('just now');
  });
  it('reads future and unparsable times as just now', () => {
    expect(relativeTime('2026-11-29T12:10:00Z', now)).toBe('just now');
    expect(relativeTime('not a date', now)).toBe('just now');
  });
});

describe('baseName', () => {
  it('keeps the last path component', () => {
    expect(baseName('work/train.ipynb')).toBe('train.ipynb');
    expect(baseName('train.ipynb')).toBe('train.ipynb');
  });
});

describe('shortenIds', () => {
  it('cuts full kernel and image ids to their short form, and nothing else', () => {
    expect(
      shortenIds(
        'image 3f9a2c51e0b4d6e7f8a9b0c1d2e3f4a5 is needed by running kernel 0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9; resume or shut down that kernel first'
      )
    ).toBe(
      'image 3f9a2c51 is needed by running kernel 0b1c2d3e; resume or shut down that kernel first'
    );
    expect(shortenIds('cafe 1234 deadbeef')).toBe('cafe 1234 deadbeef');
  });
});

describe('shortReason', () => {
  it('keeps the first clause, without server paths or URLs', () => {
    expect(
      shortReason(
        "the store /srv/ckpt/users/me is read-only ([Errno 30] Read-only file system: '/srv/ckpt/users/me/leases/.tmp-d6054ea0'): images can be listed; mount it writable"
      )
    ).toBe('the store is read-only');
    expect(
      shortReason(
        'cannot reach the store s3://bucket/me (Connect timeout on endpoint URL: "http://10.0.0.9:9000/bucket"); check that it is up'
      )
    ).toBe('cannot reach the store');
  });
  it('keeps a message that is all detail', () => {
    expect(shortReason('/a/b')).toBe('/a/b');
  });
});
