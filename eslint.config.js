// Lint: typescript-eslint's type-checked recommendations plus the rules that keep the layout honest.
// The boundaries are checked here, not by memory:
//   - no import cycles anywhere (import-x/no-cycle, type imports included);
//   - a backend never imports the daemon;
//   - a CNI plugin imports only its own folder, skel/, lib/ and src/ (cmd/ composes them);
//   - node:child_process only in the one process runner (src/util/exec.ts).
import js from '@eslint/js';
import { createTypeScriptImportResolver } from 'eslint-import-resolver-typescript';
import importX from 'eslint-plugin-import-x';
import tseslint from 'typescript-eslint';

const childProcess = {
  name: 'node:child_process',
  message: 'Run programs through src/util/exec.ts (the one runner: argument arrays, deadlines, CommandError).',
};
const childProcessBare = { ...childProcess, name: 'child_process' };

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  // This file and other plain JavaScript are not in the TypeScript project.
  { files: ['**/*.js'], ...tseslint.configs.disableTypeChecked },
  {
    files: ['**/*.ts'],
    languageOptions: {
      parserOptions: { project: './tsconfig.test.json', tsconfigRootDir: import.meta.dirname },
    },
    plugins: { 'import-x': importX },
    settings: {
      ...importX.flatConfigs.typescript.settings,
      'import-x/resolver-next': [createTypeScriptImportResolver({ project: './tsconfig.test.json' })],
    },
    rules: {
      '@typescript-eslint/no-explicit-any': 'error',
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/await-thenable': 'error',
      '@typescript-eslint/require-await': 'error',
      '@typescript-eslint/switch-exhaustiveness-check': ['error', { considerDefaultExhaustiveForUnions: true }],
      '@typescript-eslint/consistent-type-imports': ['error', { fixStyle: 'inline-type-imports' }],
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      'no-constant-condition': ['error', { checkLoops: false }],
      // IPNet and IPAddr print their text form.
      '@typescript-eslint/restrict-template-expressions': [
        'error',
        { allowNumber: true, allowBoolean: true, allow: [{ from: 'file', name: ['IPNet', 'IPAddr'], path: 'src/util/ip.ts' }] },
      ],
    },
  },
  {
    // Test and benchmark fakes implement async interfaces with synchronous bodies.
    files: ['test/**/*.ts', 'bench/**/*.ts'],
    rules: { '@typescript-eslint/require-await': 'off' },
  },
  {
    // What ships has no import cycles (tests and benchmarks only import it).
    files: ['src/**/*.ts', 'cni-plugins/**/*.ts'],
    rules: { 'import-x/no-cycle': ['error', { ignoreExternal: true }] },
  },
  {
    files: ['src/**/*.ts', 'cni-plugins/**/*.ts'],
    ignores: ['src/util/exec.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': ['error', { paths: [childProcess, childProcessBare] }],
    },
  },
  {
    files: ['src/backend/**/*.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          paths: [childProcess, childProcessBare],
          patterns: [{ group: ['**/daemon/*', '**/daemon'], message: 'A backend never imports the daemon: what it needs from outside is declared in src/backend/backend.ts.' }],
        },
      ],
    },
  },
  {
    files: ['cni-plugins/*/**/*.ts'],
    ignores: ['cni-plugins/cmd/**'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          paths: [childProcess, childProcessBare],
          patterns: [
            {
              regex: '^\\.\\./(?!skel/|lib/|\\.\\./)',
              message: 'A CNI plugin does not import a sibling plugin: shared code lives in cni-plugins/lib/ (or skel/); cni-plugins/cmd/ composes plugins.',
            },
          ],
        },
      ],
    },
  },
);
