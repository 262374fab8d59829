// onnxruntime-node from tests/onnx/node_modules (tests/onnx/package.json), for run_ort.js and
// run_ort_ctr.js: exits 3 with how to install it when it is missing.
'use strict';
const path = require('path');

module.exports = function loadOrt() {
  const where = path.join(__dirname, 'node_modules', 'onnxruntime-node');
  try {
    return require(where);
  } catch (e) {
    console.error(`onnxruntime-node is not installed in ${path.dirname(where)} (scripts/deps test installs it: ` +
                  `npm ci --ignore-scripts --prefix tests/onnx): ${e.message.split('\n')[0]}`);
    process.exit(3);
  }
};
