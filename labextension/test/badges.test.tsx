import * as React from 'react';
import { renderToStaticMarkup } from 'react-dom/server';
import { describe, expect, it } from 'vitest';

import { RecoveredBadge } from '../src/badges';

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
