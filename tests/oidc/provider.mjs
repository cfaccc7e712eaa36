// A real OpenID Provider for tollgate's admin sign-in tests: panva's
// oidc-provider (a certified OpenID Connect implementation), configured
// here and started by the tests (tests/api/oidc.rs), one process per test.
//
//   node provider.mjs            listens on 127.0.0.1 on a free port and
//                                prints {"issuer": "http://127.0.0.1:<port>"}
//
// What it is configured with:
// - the client `tollgate` (authorization code flow, client_secret_basic,
//   PKCE required); its redirect URIs come from the test once tollgate has
//   its port (POST /test/configure {"redirect_uris": [...]});
// - people who sign in through the development login form (any password):
//   `vera` (roles ["tollgate-viewer"]), `olga` (["tollgate-operator"]),
//   `ada` (["tollgate-auditor"]), `nora` (no role); each has a verified
//   email `<name>@example.com`. The ID token carries `email`,
//   `email_verified` and `roles` (scopes `email` and `roles`);
// - machine clients for the client-credentials grant, whose JWT access
//   tokens carry roles too: `robot-viewer`, `robot-operator`,
//   `robot-auditor`, `robot-none` (secret: `<client id>-secret-0123456789`);
// - two resource servers with JWT access tokens (RFC 9068, RS256):
//   `https://tollgate.test/admin/api` and `https://other.test/api`;
// - RS256 signing keys it generates; POST /test/rotate replaces them with a
//   new key (a new `kid`) and serves the new JWKS.
// Test-only helper: POST /test/sign {"header": {...}, "claims": {...}} signs
// a JWT with the current key (RS256; `header` may add fields or name another `kid`), to
// make tokens the provider would never issue (expired, another issuer).

import { createServer } from 'node:http';

import * as jose from 'jose';
import Provider, { errors } from 'oidc-provider';

export const API = 'https://tollgate.test/admin/api';
export const OTHER_API = 'https://other.test/api';

const PEOPLE = {
  vera: ['tollgate-viewer'],
  olga: ['tollgate-operator'],
  ada: ['tollgate-auditor'],
  nora: [],
};
const ROBOTS = {
  'robot-viewer': ['tollgate-viewer'],
  'robot-operator': ['tollgate-operator'],
  'robot-auditor': ['tollgate-auditor'],
  'robot-none': [],
};

let issuer;
let redirectUris = [];
let signingKey; // { privateJwk, publicJwk, key }
let provider;
let jwksFetches = 0;

async function newKey() {
  const { privateKey } = await jose.generateKeyPair('RS256', { extractable: true });
  const privateJwk = await jose.exportJWK(privateKey);
  privateJwk.kid = `k-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
  privateJwk.alg = 'RS256';
  privateJwk.use = 'sig';
  return { privateJwk, key: privateKey };
}

function build() {
  const clients = [
    {
      client_id: 'tollgate',
      client_secret: 'tollgate-client-secret-0123456789',
      redirect_uris: redirectUris.length ? redirectUris : ['http://127.0.0.1/unset'],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    },
    ...Object.keys(ROBOTS).map((id) => ({
      client_id: id,
      client_secret: `${id}-secret-0123456789`,
      redirect_uris: [],
      response_types: [],
      grant_types: ['client_credentials'],
      token_endpoint_auth_method: 'client_secret_basic',
    })),
  ];
  const p = new Provider(issuer, {
    clients,
    jwks: { keys: [signingKey.privateJwk] },
    claims: { openid: ['sub'], email: ['email', 'email_verified'], roles: ['roles'] },
    scopes: ['openid', 'email', 'roles', 'admin'],
    conformIdTokenClaims: false,
    pkce: { required: () => true },
    async findAccount(_ctx, id) {
      if (!(id in PEOPLE)) return undefined;
      return {
        accountId: id,
        async claims() {
          return { sub: id, email: `${id}@example.com`, email_verified: true, roles: PEOPLE[id] };
        },
      };
    },
    // No consent screen: tollgate is a first-party client.
    async loadExistingGrant(ctx) {
      const grantId = ctx.oidc.result?.consent?.grantId
        || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
      if (grantId) return ctx.oidc.provider.Grant.find(grantId);
      const grant = new ctx.oidc.provider.Grant({
        clientId: ctx.oidc.client.clientId,
        accountId: ctx.oidc.session.accountId,
      });
      grant.addOIDCScope('openid email roles');
      await grant.save();
      return grant;
    },
    async extraTokenClaims(_ctx, token) {
      const who = token.accountId ?? token.clientId;
      return { roles: PEOPLE[who] ?? ROBOTS[who] ?? [] };
    },
    features: {
      devInteractions: { enabled: true },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: (_ctx, _client, oneOf) => oneOf ?? API,
        useGrantedResource: () => true,
        getResourceServerInfo(_ctx, resource) {
          if (resource !== API && resource !== OTHER_API) throw new errors.InvalidTarget();
          return {
            scope: 'admin',
            audience: resource,
            accessTokenTTL: 300,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: 'RS256' } },
          };
        },
      },
    },
  });
  // Quiet: a test reads only the first line of standard output.
  p.on('server_error', (_ctx, err) => console.error('oidc-provider:', err));
  return p;
}

async function body(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString('utf8');
  return text ? JSON.parse(text) : {};
}

function json(res, status, value) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(value));
}

async function test(req, res) {
  if (req.method === 'POST' && req.url === '/test/configure') {
    redirectUris = (await body(req)).redirect_uris ?? [];
    provider = build();
    return json(res, 200, { issuer, redirect_uris: redirectUris });
  }
  if (req.method === 'POST' && req.url === '/test/rotate') {
    signingKey = await newKey();
    provider = build();
    return json(res, 200, { kid: signingKey.privateJwk.kid });
  }
  if (req.method === 'POST' && req.url === '/test/sign') {
    const { header = {}, claims = {} } = await body(req);
    const token = await new jose.SignJWT(claims)
      .setProtectedHeader({ kid: signingKey.privateJwk.kid, ...header, alg: 'RS256' })
      .sign(signingKey.key);
    return json(res, 200, { token });
  }
  if (req.method === 'GET' && req.url === '/test/stats') {
    return json(res, 200, { jwks_fetches: jwksFetches, kid: signingKey.privateJwk.kid });
  }
  return json(res, 404, { error: 'not_found' });
}

const server = createServer((req, res) => {
  if (req.url.startsWith('/test/')) {
    test(req, res).catch((err) => json(res, 500, { error: String(err) }));
    return;
  }
  if (req.url === '/jwks') jwksFetches += 1;
  provider.callback()(req, res);
});

signingKey = await newKey();
server.listen(0, '127.0.0.1', () => {
  issuer = `http://127.0.0.1:${server.address().port}`;
  provider = build();
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});
// The test kills the process; also stop when its standard input closes.
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
