/** Human-readable sizes, durations and times for the panel and the status bar. */

const UNITS = ['B', 'KB', 'MB', 'GB', 'TB'];

/** Decimal units, as GPU vendors quote memory: 12.3 GB. */
export function formatBytes(bytes: number): string {
  let value = bytes;
  let unit = 0;
  while (value >= 1000 && unit < UNITS.length - 1) {
    value /= 1000;
    unit++;
  }
  const digits = unit === 0 || value >= 100 ? 0 : 1;
  return `${value.toFixed(digits)} ${UNITS[unit]}`;
}

/** A span of time at the coarsest unit that still says something: "45 s", "14 min", "3 h". */
export function formatDuration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  const minutes = Math.round(s / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  const hours = Math.round(minutes / 60);
  return hours < 48 ? `${hours} h` : `${Math.round(hours / 24)} d`;
}

/** "just now", "5 min ago", "3 d ago"; future times (clock skew) read as just now. */
export function relativeTime(iso: string, now: number): string {
  const seconds = (now - Date.parse(iso)) / 1000;
  if (!(seconds >= 45)) {
    return 'just now';
  }
  return `${formatDuration(seconds)} ago`;
}

/** The exact local time, for hover text. */
export function exactTime(iso: string): string {
  const date = new Date(iso);
  return isNaN(date.getTime()) ? iso : date.toLocaleString();
}

/** The last path component: "work/train.ipynb" -> "train.ipynb". */
export function baseName(path: string): string {
  return path.split('/').pop() || path;
}

/** Ids in full only on hover: their first 8 hex digits, the whole first group of a
 * kernel's UUID (never cut inside a group), a prefix every command accepts. */
export function shortId(id: string): string {
  return id.slice(0, 8);
}

/** `text` with every full kernel or image id in it cut to its short form, as the panel
 * shows ids ("needed by running kernel 3f9a2c51"): full ids only on hover or copy. */
export function shortenIds(text: string): string {
  return text.replace(
    /\b(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{24,})\b/g,
    id => shortId(id)
  );
}

/**
 * A server's failure message as one short sentence for a notification: its first
 * clause (up to the parenthesis or semicolon that starts the detail and the advice),
 * without server paths or URLs, and with short ids. The whole message stays available
 * behind "Show details".
 */
export function shortReason(message: string): string {
  const first = message.split(/\s\(|;\s|\.\s/)[0];
  const short = shortenIds(first)
    .replace(/\s(?:\/|[a-z][a-z0-9+.-]*:\/\/)\S*/gi, '')
    .replace(/\s+/g, ' ')
    .trim();
  return short || shortenIds(message);
}
