// The JSON request a driver script reads on stdin (the Python suites write it).
'use strict';

function readStdin() {
  return new Promise((resolve) => {
    let text = '';
    process.stdin.on('data', (chunk) => { text += chunk; });
    process.stdin.on('end', () => resolve(JSON.parse(text)));
  });
}

module.exports = { readStdin };
