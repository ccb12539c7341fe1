/**
 * The store's health and use at the top of the panel, as jupyter-resource-usage shows
 * memory: "Store: 1.2 GB / 10 GB" over a bar, against the store's quota, else the free
 * space of a local store's file system; warn colours as it fills, and "unavailable"
 * while the server cannot use it.
 */

import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatBytes } from './format';
import { IStoreHealth, IStoreUsage } from './types';

/** From which share of its room on the meter warns, and from which it alarms. */
const WARN_AT = 0.8;
const ALARM_AT = 0.95;

export interface IMeterReading {
  /** What the meter says: "Store: 1.2 GB / 10 GB". */
  text: string;
  /** Everything, for its tooltip. */
  title: string;
  /** The share of the room used (0 to 1), null when there is no room to measure. */
  share: number | null;
  /** The bytes shown against the room, for the meter's ARIA values. */
  used: number;
  room: number | null;
}

export function meterReading(
  usage: IStoreUsage,
  trans: TranslationBundle
): IMeterReading {
  const images = trans._n('%1 image', '%1 images', usage.images);
  if (usage.quota_bytes) {
    const share = usage.bytes / usage.quota_bytes;
    return {
      text: trans.__(
        'Store: %1 / %2',
        formatBytes(usage.bytes),
        formatBytes(usage.quota_bytes)
      ),
      title: trans.__(
        '%1 of the store quota of %2 used by %3 (%4%); the oldest images are removed beyond it.',
        formatBytes(usage.bytes),
        formatBytes(usage.quota_bytes),
        images,
        Math.round(share * 100)
      ),
      share,
      used: usage.bytes,
      room: usage.quota_bytes
    };
  }
  if (usage.disk_bytes && usage.disk_free_bytes !== null) {
    const taken = usage.disk_bytes - usage.disk_free_bytes;
    return {
      text: trans.__(
        'Store: %1 · disk %2 free',
        formatBytes(usage.bytes),
        formatBytes(usage.disk_free_bytes)
      ),
      title: trans.__(
        '%1 used by %2, no quota; the disk it is on has %3 free of %4.',
        formatBytes(usage.bytes),
        images,
        formatBytes(usage.disk_free_bytes),
        formatBytes(usage.disk_bytes)
      ),
      share: taken / usage.disk_bytes,
      used: taken,
      room: usage.disk_bytes
    };
  }
  return {
    text: trans.__('Store: %1', formatBytes(usage.bytes)),
    title: trans.__(
      '%1 used by %2, no quota.',
      formatBytes(usage.bytes),
      images
    ),
    share: null,
    used: usage.bytes,
    room: null
  };
}

export function StoreMeter(props: {
  store: IStoreHealth | null;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { store, trans } = props;
  const usage = store?.usage;
  if (!store || !usage) {
    return null;
  }
  const reading = meterReading(usage, trans);
  const level =
    !store.ok || (reading.share ?? 0) >= ALARM_AT
      ? 'jp-mod-alarm'
      : (reading.share ?? 0) >= WARN_AT
        ? 'jp-mod-warn'
        : '';
  return (
    <div
      className={`jp-CkptStoreMeter ${level}`}
      title={store.ok ? reading.title : trans.__('The store is unavailable')}
    >
      <span className="jp-CkptStoreMeter-text">
        {store.ok ? reading.text : trans.__('Store: unavailable')}
      </span>
      {reading.share !== null && (
        <div
          className="jp-CkptStoreMeter-bar"
          role="meter"
          aria-label={trans.__('Image store use')}
          aria-valuemin={0}
          aria-valuemax={reading.room ?? undefined}
          aria-valuenow={reading.used}
          aria-valuetext={reading.title}
        >
          <div
            className="jp-CkptStoreMeter-fill"
            style={{ width: `${Math.min(100, reading.share * 100)}%` }}
          />
        </div>
      )}
    </div>
  );
}
