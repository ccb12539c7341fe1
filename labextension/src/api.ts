/** `/api/ckpt/...` over the server connection JupyterLab already uses (auth, XSRF). */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import {
  ICkptApi,
  IImage,
  IImageDetails,
  IResumeReply,
  IStatusReply,
  IWriteReply
} from './types';

export class CkptApi implements ICkptApi {
  constructor(
    private readonly _settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  listImages(): Promise<IImage[]> {
    return this._request('images');
  }

  getImage(id: string): Promise<IImageDetails> {
    return this._request(`images/${encodeURIComponent(id)}`);
  }

  async deleteImage(id: string): Promise<void> {
    await this._request(`images/${encodeURIComponent(id)}`, {
      method: 'DELETE'
    });
  }

  resume(
    id: string,
    options: { path?: string; kernel_name?: string }
  ): Promise<IResumeReply> {
    return this._request(`images/${encodeURIComponent(id)}/resume`, {
      method: 'POST',
      body: JSON.stringify(options)
    });
  }

  checkpoint(kernelId: string, name?: string): Promise<IWriteReply> {
    return this._request(`kernels/${kernelId}/checkpoint`, {
      method: 'POST',
      body: JSON.stringify(name ? { name } : {})
    });
  }

  suspend(kernelId: string): Promise<IWriteReply> {
    return this._request(`kernels/${kernelId}/suspend`, {
      method: 'POST',
      body: '{}'
    });
  }

  status(kernelId?: string): Promise<IStatusReply> {
    return this._request(
      kernelId ? `status?kernel_id=${encodeURIComponent(kernelId)}` : 'status'
    );
  }

  /** The JSON answer; a 4xx/5xx rejects with the server's message (why a delete was
   * refused, which variables blocked a suspend). */
  private async _request<T>(path: string, init: RequestInit = {}): Promise<T> {
    const url = URLExt.join(this._settings.baseUrl, 'api/ckpt', path);
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this._settings);
    } catch (error) {
      throw new ServerConnection.NetworkError(error as TypeError);
    }
    if (!response.ok) {
      throw await ServerConnection.ResponseError.create(response);
    }
    const text = await response.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }
}
