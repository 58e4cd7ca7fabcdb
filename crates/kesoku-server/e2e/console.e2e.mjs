// Browser end-to-end test of the web console, in headless Chromium (Debian's `chromium`) driven
// by playwright-core. Run it through run.sh, which starts the real `kesoku start` with a mock
// model (kesoku-mock-model's `console` scenario: what each question below gets is written there).
//
// It logs in with the token, sends a message from the sessions view, and watches the trajectory
// grow live in the session view: the thought, the tool call (⏳ then ✅), the answer with its
// metrics; then a failing tool (❌), the stop button, a model that refuses, the sessions list's
// live status, and the activations view. With SCREENSHOT_DIR set, it saves the three views as PNG.
//
// Environment: BASE_URL (required), KESOKU_TOKEN (required), SCREENSHOT_DIR (optional),
// CHROMIUM (default /usr/bin/chromium).

import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

const base = process.env.BASE_URL;
const token = process.env.KESOKU_TOKEN;
const shots = process.env.SCREENSHOT_DIR;
if (!base || !token) {
  console.error('BASE_URL and KESOKU_TOKEN must be set (use run.sh)');
  process.exit(2);
}

const results = [];
function step(name) {
  results.push(name);
  console.log('ok - ' + name);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
let failed = false;
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 }, deviceScaleFactor: 1 });
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (error) => problems.push('page error: ' + error.message));
  page.on('console', (message) => {
    if (message.type() !== 'error') return;
    const text = message.text();
    // The first API calls answer 401 until the token is entered: expected.
    if (text.includes('401')) return;
    problems.push('console error: ' + text);
  });
  page.setDefaultTimeout(15000);

  // 1. The console asks for the token, then goes live.
  await page.goto(base + '/');
  await page.waitForSelector('#login[open]');
  await page.fill('#login-token', token);
  await page.click('#login-form button[type=submit]');
  await page.waitForSelector('#live.on');
  step('logged in with the token and the event stream is live');

  // 2. Send a message from the sessions view; the session view opens.
  await page.fill('#new-channel', 'web');
  await page.fill('#new-text', 'What is the weather in Tokyo?');
  await page.click('#new-send');
  await page.waitForURL(/#\/session\/sess_/);
  const sessionId = decodeURIComponent(page.url().split('#/session/')[1]);
  step('sent a message; session ' + sessionId + ' opened');

  // 3. The trajectory grows live: thought first (no answer yet), then the call ⏳, then ✅, then the answer.
  await page.waitForSelector('#trajectory details.thought');
  const thought = await page.textContent('#trajectory details.thought .pre');
  if (!thought.includes('I will search the web')) throw new Error('unexpected thought: ' + thought);
  if (await page.$('#trajectory .msg.assistant')) throw new Error('the answer was already there: not live');
  step('the thought appeared before the answer');
  await page.waitForSelector('#trajectory details.tool:has(.icon:text-is("⏳"))');
  step('the tool call appeared running (⏳)');
  await page.waitForSelector('#trajectory details.tool:has(.icon:text-is("✅"))');
  step('the tool call turned ✅ when its result arrived');
  await page.waitForSelector('#trajectory .msg.assistant .text:has-text("Here is what I found")');
  await page.waitForSelector('#trajectory .msg.assistant .metrics:has-text("tokens this turn")');
  await page.waitForSelector('#trajectory .msg.user .badge.processed');
  step('the answer with turn metrics appeared and the message is done');

  // 4. A failing tool shows ❌ with its error.
  await page.fill('#composer-text', 'Please fail the search');
  await page.click('#composer-send');
  await page.waitForSelector('#trajectory details.tool:has(.icon:text-is("❌"))');
  await page.click('#trajectory details.tool:has(.icon:text-is("❌")) summary');
  await page.waitForSelector('#trajectory .tool-error:has-text("exit code 3")');
  await page.waitForSelector('#trajectory .tool-result:has-text("HTTP 503")');
  await page.waitForSelector('#trajectory .msg.assistant .text:has-text("The search tool failed")');
  step('a failed tool call shows ❌ and its error');

  // Open the first thought and tool call for the screenshot.
  await page.click('#trajectory details.thought >> nth=0 >> summary');
  await page.click('#trajectory details.tool >> nth=0 >> summary');
  if (shots) {
    mkdirSync(shots, { recursive: true });
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: join(shots, 'session.png'), fullPage: true });
  }

  // 5. Stop interrupts a running turn.
  await page.fill('#composer-text', 'A long question to interrupt');
  await page.click('#composer-send');
  await page.waitForSelector('#trajectory .msg.user .badge.processing');
  await page.click('#btn-stop');
  await page.waitForSelector('#session-info .notice:has-text("Stop requested")');
  await page.waitForSelector('#trajectory .msg.user .badge.interrupted');
  step('stop interrupted the running turn');

  // 6. "Why stuck?" explains the state.
  // The service lets go of the turn a moment after the message is interrupted: ask again until idle.
  let idle = false;
  for (let attempt = 0; attempt < 10 && !idle; attempt++) {
    await page.click('#btn-state');
    await page.waitForSelector('#session-info .state dt:text-is("Summary")');
    idle = (await page.textContent('#session-info .state dl')).includes('idle: nothing runs');
    if (!idle) await page.waitForTimeout(300);
  }
  if (!idle) throw new Error('the state panel never said idle: ' + await page.textContent('#session-info'));
  step('the state panel explains the session');

  // 6b. A model that refuses the request: the message ends in error, with a notification.
  await page.fill('#composer-text', 'Please break the model');
  await page.click('#composer-send');
  await page.waitForSelector('#trajectory .msg.user .badge.error');
  await page.waitForSelector('#trajectory .msg:has-text("An error occurred")');
  step('a model error marks the message error and says so');

  // 7. Another session, then the sessions list with live status.
  await page.goto(base + '/#/sessions');
  await page.fill('#new-channel', 'ops');
  await page.fill('#new-text', 'Check the disk usage of the build server');
  await page.click('#new-send');
  await page.waitForURL(/#\/session\/sess_/);
  await page.waitForSelector('#trajectory details.thought');
  await page.goto(base + '/#/sessions');
  await page.waitForSelector('#sessions-table tr.session-row >> nth=1');
  await page.waitForSelector('#sessions-table .badge.running');
  step('the sessions list shows a running session live');
  if (shots) await page.screenshot({ path: join(shots, 'sessions.png'), fullPage: true });
  await page.waitForSelector('#sessions-table .badge.running', { state: 'detached' });
  const rows = await page.$$('#sessions-table tr.session-row');
  if (rows.length < 2) throw new Error('expected two sessions, got ' + rows.length);
  step('the sessions list went back to idle when the turn ended');
  const lanes = await page.textContent('#health-lanes');
  if (!lanes.includes('interactive')) throw new Error('the health panel lacks lane depths');
  step('the health panel shows queue depth per lane');

  // 8. The activations view, with its filter.
  await page.goto(base + '/#/activations');
  await page.waitForSelector('#activations-table tr.activation-row >> nth=2');
  const outcomes = await page.$$eval('#activations-table .badge', (nodes) => nodes.map((n) => n.textContent));
  for (const expected of ['succeeded', 'failed', 'interrupted']) {
    if (!outcomes.includes(expected)) throw new Error('no ' + expected + ' activation in ' + outcomes.join(','));
  }
  step('the activations view lists succeeded, failed and interrupted turns');
  if (shots) await page.screenshot({ path: join(shots, 'activations.png'), fullPage: true });
  await page.check('#filter-failed');
  await page.waitForFunction(() => {
    const badges = [...document.querySelectorAll('#activations-table .badge')].map((n) => n.textContent);
    return badges.length > 0 && !badges.includes('succeeded');
  });
  step('the failed-only filter hides succeeded turns');

  if (problems.length) throw new Error('browser problems:\n' + problems.join('\n'));
  step('no page or console errors (the CSP allowed everything the console needs)');
} catch (error) {
  failed = true;
  console.error('not ok - ' + (error && error.stack ? error.stack : error));
} finally {
  await browser.close();
}
console.log(`${results.length} passed, ${failed ? 1 : 0} failed`);
process.exit(failed ? 1 : 0);
