// Where the CNI server's plugin work runs. weftd uses a PluginProcess (plugin-process.ts): one
// long-lived child process that runs every request, so spawning the plugins' helper programs
// (fork(2) of a process costs time in proportion to its memory: 25 ms each from a 300 MB weftd,
// measured) and any plugin bug stay off weftd's event loop. That child runs the plugins with an
// InProcessExecutor, as the server's unit tests do directly.
import { AsyncLocalStorage } from 'node:async_hooks';

import { invoke, type InvokeOutput } from '../../cni-plugins/skel/run.js';
import { captureStderr } from '../../cni-plugins/skel/stderr.js';
import type { Env } from '../../cni-plugins/skel/env.js';
import type { CniPlugin } from '../../cni-plugins/skel/types.js';
import { errorMessage } from '../util/errors.js';

export type PluginRegistry = ReadonlyMap<string, CniPlugin>;

/** The plugin failed outside its own error handling (an uncaught exception, its process died). */
export class PluginRunError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PluginRunError';
  }
}

export interface PluginExecutor {
  /** Gets ready (loads the plugins, starts a process); never rejects. */
  start(): void;
  /**
   * Runs one request as the plugin's process would: its exit status, stdout and stderr (the
   * plugin's diagnostics included). Rejects with PluginRunError when the run failed outside the
   * plugin's own error handling.
   */
  run(plugin: string, env: Env, stdin: string): Promise<InvokeOutput>;
  stop(): Promise<void>;
}

/** The async context of one request's plugin work, for claimUncaught. */
interface RequestContext {
  fail(err: unknown): void;
}

/** Runs the plugins in this process (the plugin process's own executor, and the unit tests'). */
export class InProcessExecutor implements PluginExecutor {
  private registry: Promise<PluginRegistry> | null = null;
  private readonly context = new AsyncLocalStorage<RequestContext>();

  /** `load` gives the plugins by name (called once, on start or the first request). */
  constructor(private readonly load: () => PluginRegistry | Promise<PluginRegistry>) {}

  start(): void {
    void this.plugins().catch(() => undefined);
  }

  private plugins(): Promise<PluginRegistry> {
    this.registry ??= Promise.resolve().then(this.load);
    return this.registry;
  }

  async run(name: string, env: Env, stdin: string): Promise<InvokeOutput> {
    let plugin: CniPlugin | undefined;
    try {
      plugin = (await this.plugins()).get(name);
    } catch (e) {
      throw new PluginRunError(`cannot load the plugins: ${errorMessage(e)}`);
    }
    if (!plugin) throw new PluginRunError(`no plugin ${JSON.stringify(name)} here`);
    const served = plugin;
    return new Promise<InvokeOutput>((resolve, reject) => {
      const ctx: RequestContext = { fail: (e) => reject(new PluginRunError(errorMessage(e))) };
      this.context.run(ctx, () => captureStderr(() => invoke(served, env, stdin))).then(
        ({ value, stderr }) => resolve({ ...value, stderr: value.stderr + stderr }),
        (e: unknown) => reject(new PluginRunError(errorMessage(e))),
      );
    });
  }

  /**
   * For the process's uncaughtException handler: true when the exception came from a request's
   * plugin work (that request fails), false when it did not.
   */
  claimUncaught(err: unknown): boolean {
    const ctx = this.context.getStore();
    if (!ctx) return false;
    ctx.fail(err);
    return true;
  }

  async stop(): Promise<void> {}
}
