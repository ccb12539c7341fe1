import * as React from 'react';
import { renderToStaticMarkup } from 'react-dom/server';
import { describe, expect, it } from 'vitest';

import { VariablesTable } from '../src/variablestable';

const ID = '3f9a2c51e0b4d6f7a8b9c0d1e2f3a4b5';

describe('VariablesTable', () => {
  it('says so when an image holds no variables', () => {
    const html = renderToStaticMarkup(
      <VariablesTable image={{ id: ID, state: 'saved', variables: [] }} />
    );
    expect(html).toContain('no variables');
    expect(html).not.toContain('<table');
  });

  it('shows the short id, the full one on hover', () => {
    const html = renderToStaticMarkup(
      <VariablesTable
        image={{
          id: ID,
          state: 'saved',
          variables: [{ name: 'x', type: 'int', status: 'saved', bytes: 28 }]
        }}
      />
    );
    expect(html).toContain(`<code title="${ID}">3f9a2c51</code>`);
    expect(html).toContain('1 of 1 variables saved');
  });
});
