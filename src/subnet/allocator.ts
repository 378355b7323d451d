// Picks a free subnet uniformly at random among all free subnets of [min, max]. Taken prefixes
// become merged index intervals, so the cost is O(k log k) in the number k of taken prefixes,
// whatever the size of the range (a /64 range out of a /32 has 2^32 candidates).
import { randomBytes } from 'node:crypto';
import { IPAddr, IPNet } from '../util/ip.js';

export interface AllocationRange {
  /** First candidate subnet (its prefix length is the subnet length). */
  readonly min: IPNet;
  /** Last candidate subnet, same length as min. */
  readonly max: IPNet;
}

/** Returns a uniformly random bigint in [0, n). */
export type RandomBelow = (n: bigint) => bigint;

export const cryptoRandomBelow: RandomBelow = (n) => {
  if (n <= 0n) throw new RangeError('n must be positive');
  const bytes = Math.ceil(n.toString(2).length / 8) + 8; // 64 extra bits make the modulo bias negligible
  const v = BigInt(`0x${randomBytes(bytes).toString('hex')}`);
  return v % n;
};

export function candidateCount(range: AllocationRange): bigint {
  const step = range.min.size;
  return range.max.first >= range.min.first ? (range.max.first - range.min.first) / step + 1n : 0n;
}

/** Merged, sorted candidate-index intervals [lo, hi] covered by the taken prefixes. */
function takenIntervals(range: AllocationRange, taken: readonly IPNet[]): Array<[bigint, bigint]> {
  const step = range.min.size;
  const base = range.min.first;
  const count = candidateCount(range);
  const spans: Array<[bigint, bigint]> = [];
  for (const t of taken) {
    if (t.family !== range.min.family) continue;
    // A candidate is taken when it overlaps t at all.
    if (t.last < base) continue;
    const lo = t.first <= base ? 0n : (t.first - base) / step;
    const hi = (t.last - base) / step;
    if (lo >= count) continue;
    spans.push([lo, hi < count ? hi : count - 1n]);
  }
  spans.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  const merged: Array<[bigint, bigint]> = [];
  for (const s of spans) {
    const last = merged[merged.length - 1];
    if (last && s[0] <= last[1] + 1n) {
      if (s[1] > last[1]) last[1] = s[1];
    } else {
      merged.push([s[0], s[1]]);
    }
  }
  return merged;
}

function freeIn(range: AllocationRange, intervals: ReadonlyArray<[bigint, bigint]>): bigint {
  let free = candidateCount(range);
  for (const [lo, hi] of intervals) free -= hi - lo + 1n;
  return free;
}

export function freeCount(range: AllocationRange, taken: readonly IPNet[]): bigint {
  return freeIn(range, takenIntervals(range, taken));
}

/** A random free subnet, or null when the range is full. */
export function allocateSubnet(
  range: AllocationRange,
  taken: readonly IPNet[],
  random: RandomBelow = cryptoRandomBelow,
): IPNet | null {
  const intervals = takenIntervals(range, taken);
  const free = freeIn(range, intervals);
  if (free <= 0n) return null;
  // The r-th free index: walk the gaps between taken intervals.
  let r = random(free);
  let index = 0n;
  for (const [lo, hi] of intervals) {
    const gap = lo - index;
    if (r < gap) break;
    r -= gap;
    index = hi + 1n;
  }
  index += r;
  return IPNet.of(IPAddr.of(range.min.family, range.min.first + index * range.min.size), range.min.prefix);
}

/** True when `subnet` is one of the candidates of `range` (right length, aligned, within bounds). */
export function inRange(range: AllocationRange, subnet: IPNet): boolean {
  return (
    subnet.family === range.min.family &&
    subnet.prefix === range.min.prefix &&
    subnet.first >= range.min.first &&
    subnet.first <= range.max.first
  );
}
