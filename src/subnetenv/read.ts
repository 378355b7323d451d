// Reading subnet.env from disk, synchronously: the CNI plugins read it on their critical path
// (node:fs/promises alone costs ~1.5 ms to load) and weftd once at start.
import { readFileSync } from 'node:fs';

import { errnoCode, errorMessage } from '../util/errors.js';
import { NO_PREVIOUS_SUBNETS, parseSubnetEnv, previousSubnets, requireSubnetEnv, SubnetEnvError, type PreviousSubnets, type SubnetEnv } from './format.js';

/** weftd could not read or write its subnet file. */
export class SubnetFileError extends Error {
  constructor(
    readonly path: string,
    readonly operation: 'read' | 'write',
    cause: unknown,
  ) {
    // One line: it ends up in a single log line.
    super(`cannot ${operation} subnet file ${path}: ${errorMessage(cause).replace(/\s*\n\s*/g, ' ')}`, { cause });
    this.name = 'SubnetFileError';
  }
}

/** The CNI plugin's load: every failure is a SubnetEnvError naming the file. */
export function loadSubnetEnv(file: string): Promise<SubnetEnv> {
  try {
    return Promise.resolve(loadSubnetEnvSync(file));
  } catch (e) {
    return Promise.reject(e instanceof Error ? e : new Error(errorMessage(e)));
  }
}

function loadSubnetEnvSync(file: string): SubnetEnv {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    const code = errnoCode(e);
    if (code === 'ENOENT' || code === 'ENOTDIR') {
      throw new SubnetEnvError(
        file,
        'missing',
        [],
        `subnet file ${file} does not exist: weftd (flanneld) has not started or has not acquired a subnet lease ` +
          'on this node yet; check the weftd/flannel log for this node',
        { cause: e },
      );
    }
    throw new SubnetEnvError(file, 'unreadable', [], `cannot read subnet file ${file}: ${errorMessage(e)}`, { cause: e });
  }
  return requireSubnetEnv(parseSubnetEnv(text), file);
}

/** weftd at start: a missing file means a first start (all null); any other read failure is a SubnetFileError. */
export function readPreviousSubnets(path: string): Promise<PreviousSubnets> {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    if (errnoCode(e) === 'ENOENT') return Promise.resolve(NO_PREVIOUS_SUBNETS);
    return Promise.reject(new SubnetFileError(path, 'read', e));
  }
  return Promise.resolve(previousSubnets(parseSubnetEnv(text)));
}
