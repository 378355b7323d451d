// The flock(2) lock the plugins share with the reference Go plugins lives in src/util (the daemon
// takes it too, around the OVS flow table it shares with the ovs plugin).
export { FileLockError, withFileLock, type FileLockOptions } from '../../src/util/flock.js';
