// The `flannel` CNI plugin: the verbs of verbs.ts over the skeleton's delegation (CNI_PATH
// lookup, in-process when the delegate is a registered weft plugin).
import { delegateAdd, delegateCheck, delegateDel, delegateGC, delegateStatus } from '../skel/delegate.js';
import type { CniPlugin } from '../skel/types.js';
import { createFlannelPlugin } from './verbs.js';

export { createFlannelPlugin, type Delegates } from './verbs.js';

export const flannelPlugin: CniPlugin = createFlannelPlugin({
  add: delegateAdd,
  del: delegateDel,
  check: delegateCheck,
  gc: delegateGC,
  status: delegateStatus,
});
