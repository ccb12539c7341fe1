/**
 * The filter box's language: words that must all match, each either plain text, which
 * matches any field, or `field:text`, which matches one (`var:df`, `label:best`,
 * `trigger:idle`, `notebook:train`). Case is ignored; a word matches a field that
 * contains it. A word whose prefix names no field (`a:b`) is plain text, so that a
 * name with a colon in it can still be found.
 */

/** What a row can be found by. */
export type FilterField = 'notebook' | 'var' | 'label' | 'trigger';

/** The prefixes the filter knows, and the field each one searches. */
const PREFIXES: Record<string, FilterField> = {
  notebook: 'notebook',
  nb: 'notebook',
  var: 'var',
  variable: 'var',
  label: 'label',
  name: 'label',
  trigger: 'trigger'
};

/** One word of a query: `field` null for plain text. */
export interface IFilterTerm {
  field: FilterField | null;
  text: string;
}

/** The texts of a row, by field. */
export type FilterFields = Record<
  FilterField,
  readonly (string | null | undefined)[]
>;

/** The words of `query`, lower-cased; a prefix without text (`var:`) is dropped, as
 * the user is still typing it. */
export function parseFilter(query: string): IFilterTerm[] {
  const terms: IFilterTerm[] = [];
  for (const word of query.toLowerCase().split(/\s+/)) {
    const colon = word.indexOf(':');
    const field = colon > 0 ? PREFIXES[word.slice(0, colon)] : undefined;
    const text = field ? word.slice(colon + 1) : word;
    if (text) {
      terms.push({ field: field ?? null, text });
    }
  }
  return terms;
}

/** Whether the fields match every term (no terms: everything matches). */
export function matchesFilter(
  fields: FilterFields,
  terms: readonly IFilterTerm[]
): boolean {
  const contains = (field: FilterField, text: string) =>
    fields[field].some(value => value?.toLowerCase().includes(text));
  return terms.every(({ field, text }) =>
    field
      ? contains(field, text)
      : (Object.keys(fields) as FilterField[]).some(f => contains(f, text))
  );
}
