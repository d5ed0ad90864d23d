// The OpenID provider of PAW's single sign-on tests: the certified `oidc-provider`
// (panva), on 127.0.0.1, with its development sign-in pages (any password is accepted:
// the provider is not what is under test).
//
//   node provider.mjs CONFIG.json
//
// CONFIG: {"port": N, "clients": [client metadata], "accounts": {"<sub>": {"claims":
// {...}, "mint": {...}}}}. An account's `mint` makes the provider sign ID tokens that a
// relying party must refuse (OpenID Connect Core 1.0 §3.1.3.7), with its real key:
// `{"audience": "x"}` issues them for another client, `{"expired_seconds_ago": s}`
// expired s seconds ago. Prints "listening <issuer>" once it serves.
import { generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';

import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const issuer = `http://127.0.0.1:${config.port}`;
const { accounts } = config;

// A key of this run's own (not the library's published development key).
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: `paw-test-${process.pid}`, use: 'sig', alg: 'RS256' };

const provider = new Provider(issuer, {
  clients: config.clients,
  jwks: { keys: [signingKey] },
  cookies: { keys: [`paw-test-cookies-${process.pid}`] },
  scopes: ['openid', 'email', 'profile', 'groups', 'offline_access'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['preferred_username', 'name'],
    groups: ['groups', 'paw_admin'],
  },
  pkce: { required: () => true },
  features: { devInteractions: { enabled: true } },
  async findAccount(ctx, id) {
    if (!Object.hasOwn(accounts, id)) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...accounts[id].claims }; } };
  },
});

const epoch = () => Math.floor(Date.now() / 1000);
const issue = provider.IdToken.prototype.issue;
provider.IdToken.prototype.issue = async function mint(options = {}) {
  const rules = (options.use === 'idtoken' && accounts[this.available?.sub]?.mint) || {};
  let settings = options;
  if (rules.expired_seconds_ago) {
    settings = { ...options, expiresAt: epoch() - rules.expired_seconds_ago };
  }
  if (!rules.audience) return issue.call(this, settings);
  const { client } = this;
  this.client = new Proxy(client, {
    get(target, property) {
      if (property === 'clientId') return rules.audience;
      const value = Reflect.get(target, property);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  try {
    return await issue.call(this, settings);
  } finally {
    this.client = client;
  }
};

provider.listen(config.port, '127.0.0.1', () => {
  console.log(`listening ${issuer}`);
});
