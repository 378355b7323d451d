// The allocation order of the reference (allocator.go RangeIter): round robin through a range set
// starting after the last reserved IP (or at the first range's start), wrapping from a range's end
// into the next range of the set, skipping each range's gateway, and giving up once it is back
// where it started. Pure: the caller decides which candidates are free.
import { IPAddr } from '../../src/util/ip.js';
import { rangeContains, type Range, type RangeSet } from './config.js';

export interface Candidate {
  readonly ip: IPAddr;
  readonly range: Range;
}

/**
 * Yields every allocatable address of `set` once, in the reference's order. `lastReserved` is
 * the content of `last_reserved_ip.<index>`; outside the set it is ignored (round robin is lost
 * once, as upstream).
 */
export function* candidates(set: RangeSet, lastReserved: IPAddr | null): Generator<Candidate> {
  if (set.length === 0) return;
  let idx = 0;
  let cur: bigint | null = null;
  let start: bigint | null = null;
  if (lastReserved) {
    const i = set.findIndex((r) => rangeContains(r, lastReserved));
    if (i >= 0) {
      idx = i;
      cur = lastReserved.value;
    }
  }
  // Upstream relies on meeting the start address again (plugins#594 was an infinite loop when it
  // did not); the step bound makes termination independent of that.
  let budget = set.reduce((n, r) => n + (r.rangeEnd.value - r.rangeStart.value + 1n), 0n) + 2n;
  while (budget-- > 0n) {
    let r = set[idx]!;
    if (cur === null) {
      cur = r.rangeStart.value;
      start = cur;
    } else {
      if (cur === r.rangeEnd.value) {
        idx = (idx + 1) % set.length;
        r = set[idx]!;
        cur = r.rangeStart.value;
      } else {
        cur += 1n;
      }
      if (start === null) start = cur;
      else if (cur === start) return;
    }
    if (cur === r.gateway.value) continue;
    yield { ip: IPAddr.of(r.subnet.family, cur), range: r };
  }
}
