// What VXLAN encapsulation costs on the wire (outer IP + UDP + VXLAN header + inner Ethernet):
// the pod MTU is the underlay MTU minus this. flannel writes −50 for IPv4; an IPv6 underlay's
// header is 20 bytes longer.
import type { Family } from '../util/ip.js';

export const VXLAN_OVERHEAD: Readonly<Record<Family, number>> = { 4: 50, 6: 70 };
