import * as React from 'react';
import { renderToStaticMarkup } from 'react-dom/server';
import { describe, expect, it } from 'vitest';

import {
  Compatibility,
  gpuNeed,
  ProgressLine,
  RecoveredBadge
} from '../src/badges';

describe('RecoveredBadge', () => {
  it('marks a kernel recovered after a crash, with when it was autosaved', () => {
    const html = renderToStaticMarkup(
      <RecoveredBadge
        status={{
          kernel_id: 'k1',
          state: 'suspended',
          recovered: {
            autosave_at: '2026-11-29T11:00:00Z',
            crashed_after: null
          }
        }}
      />
    );
    expect(html).toContain('>recovered after a crash</span>');
    expect(html).toContain('class="jp-CkptBadge jp-mod-recovered"');
    expect(html).toContain('title="Kernel state autosaved');
  });

  it('shows nothing for any other kernel', () => {
    const html = renderToStaticMarkup(
      <RecoveredBadge status={{ kernel_id: 'k1', state: 'suspended' }} />
    );
    expect(html).toBe('');
  });
});

describe('Compatibility', () => {
  it('says nothing when the image restores here', () => {
    const compat = { verdict: 'compatible' as const, reasons: [] };
    expect(renderToStaticMarkup(<Compatibility compat={compat} id="a" />)).toBe(
      ''
    );
  });

  it('shows the verdict and every reason inline otherwise', () => {
    const compat = {
      verdict: 'incompatible' as const,
      reasons: [
        'needs a GPU; this node has none',
        'saved with torch 2.3, here 2.1'
      ]
    };
    const html = renderToStaticMarkup(<Compatibility compat={compat} id="a" />);
    expect(html).toContain('>Incompatible</span>');
    expect(html).toContain('<li>needs a GPU; this node has none</li>');
    expect(html).toContain('<li>saved with torch 2.3, here 2.1</li>');
  });
});

describe('gpuNeed', () => {
  it('names the GPU an image needs and its memory, when it needs one', () => {
    expect(gpuNeed('NVIDIA A100', 12_300_000_000)).toBe(
      'needs a GPU (NVIDIA A100, 12.3 GB)'
    );
    expect(gpuNeed('cuda:0', undefined)).toBe('needs a GPU (cuda:0)');
    expect(gpuNeed(undefined, undefined)).toBeNull();
  });
});

describe('ProgressLine', () => {
  it('shows a bar and the bytes, or nothing when no image is moving', () => {
    const html = renderToStaticMarkup(
      <ProgressLine
        progress={{ phase: 'restore', done: 500_000_000, total: 2_000_000_000 }}
      />
    );
    expect(html).toContain('<progress value="500000000" max="2000000000"');
    expect(html).toContain('Restoring · 500 MB of 2.0 GB');
    expect(renderToStaticMarkup(<ProgressLine progress={undefined} />)).toBe(
      ''
    );
  });
});
